"""The web face (``pip install nous-inbox[web]``): an ASGI app and a host of many sessions.

:class:`SessionHost` holds ``AsyncOwner`` s for the sessions of one store; :func:`create_app`
serves them over HTTP (a JSON API, Server-Sent Events, a page); ``nous-inbox serve`` runs both
under Uvicorn. Nothing outside this package imports Starlette or Uvicorn, and this package only
when ``create_app`` is first asked for, so the command line works without the extra.
"""

from typing import TYPE_CHECKING, Any

from nous_inbox.web.host import AgentFactory, SessionHost, checked_text

if TYPE_CHECKING:
    from nous_inbox.web.app import create_app

__all__ = ["AgentFactory", "SessionHost", "checked_text", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from nous_inbox.web import app

        return getattr(app, name)
    raise AttributeError(f"module 'nous_inbox.web' has no attribute {name!r}")
