"""The web face (``pip install nous-inbox[web]``): an ASGI app and a host of many sessions.

:class:`SessionHost` holds ``AsyncOwner`` s for the sessions of one store; :func:`create_app`
serves them over HTTP (a JSON API, Server-Sent Events, a page); ``nous-inbox serve`` runs both
under Uvicorn. Nothing outside this package imports Starlette or Uvicorn.
"""

from nous_inbox.web.app import create_app, event_data
from nous_inbox.web.host import MODES, AgentFactory, SessionHost, checked_text

__all__ = ["MODES", "AgentFactory", "SessionHost", "checked_text", "create_app", "event_data"]
