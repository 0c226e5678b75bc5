"""A griffe extension for the docs build: shows the library's reST-flavoured docstrings as Markdown.

The docstrings are written for a reader of the source (``pydoc``, an editor's hover) in a light
reST: ``:class:`X``` roles, ``::`` before a literal block, simple ``=====`` tables and bare
doctest blocks. The API reference renders docstrings as Markdown, so this turns each of those into
its Markdown form when the docs are built; the source stays as it is.
"""

from __future__ import annotations

import re
from typing import Any

try:  # only the docs build has griffe; pytest imports this file while collecting docs/
    from griffe import Extension
except ImportError:  # pragma: no cover - outside the docs build
    Extension = object  # type: ignore[assignment,misc]

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj|const):`~?([^`]+)`")
_RULE = re.compile(r"^\s*=+(\s+=+)+\s*$")


def markdown(text: str) -> str:
    r"""The Markdown form of one docstring.

    >>> markdown("See :class:`~nous_inbox.Inbox`.")
    'See `nous_inbox.Inbox`.'
    >>> markdown("Run it::\n\n    python -m bench\n").splitlines()
    ['Run it:', '', '```text', 'python -m bench', '```']
    """
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if _RULE.match(line):  # a simple reST table: rule, header, rule, rows, rule
            j, rules = i, 0
            while j < len(lines) and rules < 3:
                rules += bool(_RULE.match(lines[j]))
                j += 1
            out += ["```text", *lines[i:j], "```"]
            i = j
            continue
        if line.lstrip().startswith(">>>"):  # a doctest block runs to the next blank line
            indent = line[: len(line) - len(line.lstrip())]
            j = i
            while j < len(lines) and lines[j].strip():
                j += 1
            block = [x[len(indent):] if x.startswith(indent) else x.lstrip() for x in lines[i:j]]
            out += [indent + "```pycon", *(indent + x for x in block), indent + "```"]
            i = j
            continue
        if line.rstrip().endswith("::") and not line.strip().startswith(".."):
            stripped = line.rstrip()[:-2].rstrip()
            literal = [stripped + ":"] if stripped else []
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            base = len(line) - len(line.lstrip())
            k = j
            while k < len(lines) and (not lines[k].strip()
                                      or len(lines[k]) - len(lines[k].lstrip()) > base):
                k += 1
            while k > j and not lines[k - 1].strip():
                k -= 1
            body = lines[j:k]
            if body:
                cut = min(len(x) - len(x.lstrip()) for x in body if x.strip())
                out += [*literal, "", "```text", *(x[cut:] for x in body), "```", ""]
                i = k
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


class RestDocstrings(Extension):
    """Rewrites every docstring griffe loads into Markdown."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if getattr(obj, "docstring", None) is not None:
            obj.docstring.value = markdown(obj.docstring.value)
