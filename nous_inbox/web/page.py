"""The web face's page: the list of sessions and a session's page, one HTML file with its script
and style, served under a content security policy that allows only them.

The page reads the token from ``#token=`` in its address and calls the API with it; it writes
every text with ``textContent``, never as HTML.

>>> 'data-mode="steer"' in VERB_BUTTONS
True
"""

from __future__ import annotations

import html
import importlib.resources
from typing import Final

from starlette.responses import Response

from nous_inbox.verbs import VERBS, Verb
from nous_inbox.web.endpoint import Call

__all__ = ["PAGE_HEADERS", "VERB_BUTTONS", "page", "page_css", "page_js"]

_STATIC: Final = importlib.resources.files("nous_inbox.web") / "static"

#: The headers every file of the page is served with.
PAGE_HEADERS: Final = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def _verb_button(verb: Verb) -> str:
    wakes = "wakes it" if verb.wakeup else "wakes nothing"
    return (f'<button type="button" data-mode="{verb.name}" data-target="{verb.target}" '
            f'data-wakeup="{str(verb.wakeup).lower()}" '
            f'title="{html.escape(verb.meaning, quote=True)}; {wakes}">{verb.name}</button>')


#: The page's send buttons, one a verb of the table: the page reads a stored send's verb from them.
VERB_BUTTONS: Final = "\n        ".join(_verb_button(verb) for verb in VERBS.values())


async def page(call: Call) -> Response:
    """The page: the list of sessions, or one session's events and controls."""
    # Where the app is mounted, so the page's links and calls go to it.
    root = html.escape(call.request.scope.get("root_path", "").rstrip("/"), quote=True)
    text = (_STATIC / "page.html").read_text("utf-8").replace("{{root}}", root).replace(
        "{{verbs}}", VERB_BUTTONS)
    return Response(text, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


async def page_js(call: Call) -> Response:
    """The page's script."""
    return Response((_STATIC / "page.js").read_bytes(), media_type="text/javascript; charset=utf-8",
                    headers=PAGE_HEADERS)


async def page_css(call: Call) -> Response:
    """The page's style."""
    return Response((_STATIC / "page.css").read_bytes(), media_type="text/css; charset=utf-8",
                    headers=PAGE_HEADERS)
