"""The web face (``pip install nous-inbox[web]``): an ASGI app and a host of many sessions.

:class:`SessionHost` holds ``AsyncOwner`` s for the sessions of one store; :func:`create_app`
serves them over HTTP (a JSON API, Server-Sent Events, a page); ``nous-inbox serve`` runs both
under Uvicorn. Nothing outside this package imports Starlette or Uvicorn, and this package only
when ``create_app`` is first asked for, so the command line works without the extra; each name
here is loaded when first asked for.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nous_inbox.web.app import create_app
    from nous_inbox.web.host import AgentFactory, SessionHost, checked_text

__all__ = ["AgentFactory", "SessionHost", "checked_text", "create_app"]

# Loaded when first named, so `nous-inbox --help` (which reads `serve`'s parser from
# nous_inbox.web.serve) loads no owner, store or event loop, and no Starlette.
_HOMES = {"create_app": "app", "AgentFactory": "host", "SessionHost": "host", "checked_text": "host"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'nous_inbox.web' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"nous_inbox.web.{home}"), name)
