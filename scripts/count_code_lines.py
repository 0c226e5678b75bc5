"""Count the library's code lines: lines that hold a token other than a comment or a docstring.

The house measures its size this way so that prose (docstrings, comments, blank lines) never counts
against a change that explains itself. Run from a checkout::

    python scripts/count_code_lines.py            # total for nous_inbox/
    python scripts/count_code_lines.py --each     # and per module, largest first
"""

from __future__ import annotations

import argparse
import ast
import io
import sys
import tokenize
from pathlib import Path


def docstring_lines(tree: ast.AST) -> set[int]:
    """The line numbers covered by module, class and function docstrings."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                end = body[0].end_lineno or body[0].lineno
                lines.update(range(body[0].lineno, end + 1))
    return lines


def code_lines(source: str) -> int:
    """How many lines of ``source`` carry code."""
    skip = docstring_lines(ast.parse(source))
    prose = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
             tokenize.ENCODING, tokenize.ENDMARKER}
    seen: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in prose:
            continue
        for line in range(token.start[0], token.end[0] + 1):
            if line not in skip:
                seen.add(line)
    return len(seen)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="nous_inbox", help="package folder to count")
    parser.add_argument("--each", action="store_true", help="also list every module, largest first")
    args = parser.parse_args(argv)
    counts = {path: code_lines(path.read_text(encoding="utf-8"))
              for path in sorted(Path(args.root).rglob("*.py"))}
    if args.each:
        for path, count in sorted(counts.items(), key=lambda item: -item[1]):
            sys.stdout.write(f"{count:6d}  {path}\n")
    sys.stdout.write(f"{sum(counts.values()):6d}  total code lines in {args.root}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
