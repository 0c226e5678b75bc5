"""``nous-inbox serve``: one process hosting the sessions of a store, with the web face.

    nous-inbox serve --store URL --agent module:factory [--host 127.0.0.1] [--port 8321]

``factory(session)`` makes the runner of each session the host opens (see
:class:`~nous_inbox.web.host.SessionHost`); ``nous_inbox.web.scripted:agent`` is the scripted
agent of ``nous-inbox demo``. Safe by default: it binds 127.0.0.1; every API call needs the bearer
token (``--token`` or ``$NOUS_INBOX_TOKEN``; on 127.0.0.1 without one, a random one is made and
printed in the page's address); binding any other address needs a token given.

On SIGTERM or SIGINT it drains, for a rolling restart: it takes no more sessions (sends still
answer, appended to the log) and hands each held session over at its run's next boundary
(within ``--drain-timeout`` seconds, else the turn is cut off and closed as a takeover closes
it), recording a ``SessionReleased`` and giving the lease back, so another ``serve`` on the
same store takes it at once (on PostgreSQL, told by a notification). Then every event stream
ends and the server stops. A second signal stops it without waiting for the drain.

Only the parser (:func:`add_parser`) is imported with the command line: Starlette and Uvicorn
are imported when ``serve`` runs, so the command works without the web extra installed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import ipaddress
import math
import os
import secrets
import signal
from collections.abc import Iterator
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from nous_inbox.web.host import AgentFactory

__all__ = ["TOKEN_VARIABLE", "add_parser", "load_agent", "serve"]

#: The environment variable ``serve`` reads its bearer token from when ``--token`` is not given.
TOKEN_VARIABLE: Final = "NOUS_INBOX_TOKEN"
_SIGNALS: Final = (signal.SIGINT, signal.SIGTERM)


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``serve`` and its options to ``commands`` (an ``add_subparsers`` result)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "serve", help="host a store's sessions and serve the web page and API (the web extra)")
    parser.add_argument("--store", metavar="URL", default=None,
                        help="the store whose sessions to host (default: $NOUS_INBOX_STORE or the embedded SQLite file)")
    parser.add_argument("--agent", metavar="MODULE:FACTORY", required=True,
                        help="factory(session) -> runner; e.g. nous_inbox.web.scripted:agent")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8321, help="port (default 8321; 0 picks a free one)")
    parser.add_argument("--token", default=None,
                        help=f"the API's bearer token (default: ${TOKEN_VARIABLE}; needed to bind other than loopback)")
    parser.add_argument("--max-sessions", type=int, default=100,
                        help="sessions held at once, so at most this many run at once (default 100)")
    parser.add_argument("--idle-timeout", type=float, default=60.0,
                        help="seconds an idle session stays held (default 60)")
    parser.add_argument("--scan-interval", type=float, default=1.0,
                        help="seconds between looks through the store for sessions that want a wake (default 1)")
    parser.add_argument("--drain-timeout", type=float, default=10.0,
                        help="seconds a running session has to reach its next boundary when "
                             "SIGTERM drains the process (default 10)")
    parser.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                        help="another origin whose pages may call the API (repeatable; none by default)")
    return parser


def load_agent(spec: str) -> AgentFactory:
    """The factory ``spec`` names, as ``package.module:name`` (``ValueError`` saying what is
    wrong with it).

    >>> load_agent("nous_inbox.web.scripted:agent").__name__
    'agent'
    >>> load_agent("nous_inbox.web.scripted")
    Traceback (most recent call last):
    ...
    ValueError: --agent must be MODULE:FACTORY, got 'nous_inbox.web.scripted'
    """
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise ValueError(f"--agent must be MODULE:FACTORY, got {spec!r}")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--agent {spec}: cannot import {module_name!r} ({exc})") from None
    for part in attribute.split("."):
        found = getattr(found, part, None)
    if not callable(found):
        raise ValueError(f"--agent {spec}: {module_name} has no callable {attribute!r}")
    factory: AgentFactory = found
    return factory


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(args: argparse.Namespace, out: IO[str]) -> int:
    """Run ``nous-inbox serve`` until SIGINT or SIGTERM; 0 when it stopped cleanly."""
    token = args.token if args.token is not None else os.environ.get(TOKEN_VARIABLE)
    if not _is_loopback(args.host) and not token:
        raise ValueError(f"--host {args.host} is not loopback: give --token (or ${TOKEN_VARIABLE}) "
                         "so only those who know it can steer the sessions")
    made = not token
    token = token or secrets.token_urlsafe(24)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be from 0 to 65535, got {args.port}")
    for name in ("idle_timeout", "scan_interval"):
        value = getattr(args, name)
        if not math.isfinite(value) or value <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be a positive number of seconds, got {value}")
    if not math.isfinite(args.drain_timeout) or args.drain_timeout < 0:
        raise ValueError(f"--drain-timeout must be a number of seconds >= 0, got {args.drain_timeout}")
    if args.max_sessions < 1:
        raise ValueError(f"--max-sessions must be at least 1, got {args.max_sessions}")
    agent = load_agent(args.agent)
    try:
        import uvicorn  # noqa: F401

        from nous_inbox.web.app import create_app  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"nous-inbox serve needs the web extra: pip install 'nous-inbox[web]' "
                           f"({exc})") from None
    from nous_inbox.store import default_store_url, open_store

    with open_store(args.store or default_store_url()) as store:
        asyncio.run(_serve(store, agent, args, token, made, out))
    return 0


async def _serve(store: Any, agent: AgentFactory, args: argparse.Namespace, token: str,
                 made: bool, out: IO[str]) -> None:
    import uvicorn

    from nous_inbox.web.app import create_app
    from nous_inbox.web.host import SessionHost

    async with SessionHost(store, agent, max_sessions=args.max_sessions,
                           idle_timeout=args.idle_timeout, scan_interval=args.scan_interval) as host:
        app = create_app(host, token=token, cors_origins=args.cors_origin)
        config = uvicorn.Config(app, host=args.host, port=args.port, lifespan="off",
                                log_level="warning", timeout_graceful_shutdown=5)
        loop = asyncio.get_running_loop()

        drains: list[asyncio.Future[None]] = []  # the drain the first signal began

        class Server(uvicorn.Server):
            def handle_exit(self, sig: int, frame: FrameType | None) -> None:
                if not drains and self.started:  # the first signal drains, serving meanwhile
                    drains.append(asyncio.run_coroutine_threadsafe(  # type: ignore[arg-type]
                        drain(sig, frame), loop))
                    return
                # End the event streams first: one open at shutdown would hold the server
                # until its grace period ran out.
                loop.call_soon_threadsafe(host.stopping.set)
                super().handle_exit(sig, frame)

            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:
                # Uvicorn's own raises the signal again once stopped, ending the process
                # by it; a serve stopped by SIGINT or SIGTERM has stopped cleanly.
                before = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
                try:
                    yield
                finally:
                    for sig, handler in before.items():
                        signal.signal(sig, handler)

        async def drain(sig: int, frame: FrameType | None) -> None:
            try:
                await host.drain(args.drain_timeout)
            finally:
                server.handle_exit(sig, frame)

        server = Server(config)
        running = asyncio.ensure_future(server.serve())
        while not server.started and not running.done():
            await asyncio.sleep(0.02)  # uvicorn says it has bound by this flag only
        if server.started:
            port = server.servers[0].sockets[0].getsockname()[1]
            shown = "[::1]" if args.host == "::1" else args.host
            address = f"http://{shown}:{port}/" + (f"#token={token}" if made else "")
            out.write(f"nous-inbox serve: {address} (Ctrl-C stops)\n")
            out.flush()
        await running
