"""The source keeps the house's rules, read off its syntax trees.

- Nothing is deprecated: the library is unreleased, so a renamed thing has one name, no alias.
- A private name (one leading underscore) stays in its module: what another module needs is a
  public, documented name of the module whose concept it is.
- A module's ``__all__`` lists only what it defines; a package's ``__init__`` is its face and may
  gather names from its modules, as a public module may from its private one (``codec`` from
  ``_log_reader``).
- A name is imported from the module that defines it (or a package's face), so a name has one
  home and nothing keeps an old one alive.
- A module stays at most about 500 lines, so it can be read whole.
- A test drives public names only: it reads no private attribute of another object and imports no
  private name or module of the library, so what it proves holds for a user's code too.

A known exception is listed below with the reason it stands; one that no longer applies fails
the test, so the list only shrinks.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "nous_inbox"
MAX_LINES = 500

# Files other work is changing at the same time; each entry goes when that work lands.
DEPRECATED_ALLOWED: dict[str, str] = {}
PRIVATE_IMPORTS_ALLOWED: dict[tuple[str, str, str], str] = {}
FOREIGN_EXPORTS_ALLOWED: dict[tuple[str, str], str] = {}
LONG_MODULES_ALLOWED: dict[str, str] = {}

#: A test's private read that stands, by file and expression, with why.
TEST_PRIVATES_ALLOWED: dict[tuple[str, str], str] = {
    ("tests/test_cli_send.py", "parser._actions"):
        "argparse has no public walk of a parser's arguments",
    ("tests/test_cli_send.py", "argparse._SubParsersAction"):
        "argparse has no public walk of a parser's arguments",
    ("tests/test_cli_send.py", "action._choices_actions"):
        "argparse has no public walk of a parser's arguments",
    ("tests/aimu_kit.py", "client._record_tool_calls"):
        "a stand-in for aimu's model call records as aimu's own client does",
    ("tests/aimu_kit.py", "client._append_message"):
        "a stand-in for aimu's model call records as aimu's own client does",
    ("tests/test_log_bench_smoke.py", "log_bench._ours"):
        "the benchmark's own helpers, not the library's",
    ("tests/test_log_bench_smoke.py", "log_bench._stores"):
        "the benchmark's own helpers, not the library's",
    ("tests/test_log_bench_smoke.py", "log_bench._from_store"):
        "the benchmark's own helpers, not the library's",
    ("tests/test_mailbox.py", "box._lock"):
        "a notice committed as an attached owner's claim commits it, without an owner per step",
    ("tests/test_mailbox.py", "box._commit"):
        "a notice committed as an attached owner's claim commits it, without an owner per step",
    ("tests/test_store_postgres.py", "holder._background"):
        "stops a store's renewals, as a paused host's stop: no user has a reason to, so no hook",
    ("tests/test_store_postgres.py", "watcher._background"):
        "stages a notification inside a renewal's round trip: no public moment to do it at",
    ("tests/test_store_postgres.py", "background._renew"):
        "stages a notification inside a renewal's round trip: no public moment to do it at",
    ("tests/test_store_postgres_processes.py", "old_store._background"):
        "stops a store's renewals, as a paused host's stop: no user has a reason to, so no hook",
}


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE).as_posix(), parsed(path)


def module_name(relative: str) -> str:
    parts = ["nous_inbox", *relative.removesuffix(".py").split("/")]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def held_to(found: dict[object, str], allowed: dict[object, str], rule: str) -> None:
    """Nothing breaks ``rule`` but what is allowed, and everything allowed still breaks it."""
    new = {key: where for key, where in found.items() if key not in allowed}
    stale = sorted(str(key) for key in allowed if key not in found)
    assert not new, f"{rule}:\n" + "\n".join(sorted(new.values()))
    assert not stale, f"allowed exceptions to '{rule}' that no longer apply (remove them): {stale}"


def test_nothing_is_deprecated() -> None:
    found: dict[object, str] = {}
    for relative, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "DeprecationWarning":
                found[relative] = f"{relative}:{node.lineno} warns of a deprecated name"
    held_to(found, dict(DEPRECATED_ALLOWED), "nothing is deprecated")


def test_no_private_name_is_imported_from_another_module() -> None:
    found: dict[object, str] = {}
    for relative, tree in modules():
        here = module_name(relative)
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.level or node.module == here:
                continue
            if not (node.module or "").startswith("nous_inbox"):
                continue
            for alias in node.names:
                if is_private(alias.name):
                    found[(relative, node.module, alias.name)] = (
                        f"{relative}:{node.lineno} imports {alias.name} from {node.module}")
    held_to(found, dict(PRIVATE_IMPORTS_ALLOWED), "a private name stays in its module")


def defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def exported_names(tree: ast.Module) -> list[str]:
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert node.value is not None
            value = ast.literal_eval(node.value)
            assert isinstance(value, list)
            return [str(name) for name in value]
    return []


def from_private_modules(tree: ast.Module) -> set[str]:
    """The names ``tree`` imports from a private module (``nous_inbox._log_reader``)."""
    return {alias.asname or alias.name for node in tree.body if isinstance(node, ast.ImportFrom)
            and any(is_private(part) for part in (node.module or "").split("."))
            for alias in node.names}


def test_a_module_exports_only_what_it_defines() -> None:
    found: dict[object, str] = {}
    for relative, tree in modules():
        if relative.endswith("__init__.py"):
            continue  # a package's face gathers its modules' names
        defined = defined_names(tree) | from_private_modules(tree)
        for name in exported_names(tree):
            if name not in defined:
                found[(relative, name)] = f"{relative} exports {name}, defined elsewhere"
    held_to(found, dict(FOREIGN_EXPORTS_ALLOWED), "a module exports only what it defines")


def test_a_name_is_imported_from_its_home() -> None:
    trees = dict(modules())
    homes = {module_name(relative): relative for relative in trees}
    sources = [*trees.items(), *(
        (path.relative_to(PACKAGE.parent).as_posix(), parsed(path))
        for folder in ("tests", "bench") for path in sorted((PACKAGE.parent / folder).rglob("*.py"))
    )]
    defines = {relative: defined_names(tree) | from_private_modules(tree)
               for relative, tree in trees.items()}
    found: dict[object, str] = {}
    for relative, tree in sources:
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom) or node.module not in homes:
                continue
            source = homes[node.module]
            if source.endswith("__init__.py"):
                continue  # a package's face
            defined = defines[source]
            for alias in node.names:
                if alias.name not in defined and f"{node.module}.{alias.name}" not in homes:
                    found[(relative, alias.name)] = (
                        f"{relative}:{node.lineno} imports {alias.name} from {node.module}, "
                        "which does not define it")
    held_to(found, {}, "a name is imported from its home")


def test_every_module_is_at_most_500_lines() -> None:
    found: dict[object, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_LINES:
            found[relative] = f"{relative} has {lines} lines"
    held_to(found, dict(LONG_MODULES_ALLOWED), f"a module has at most {MAX_LINES} lines")


#: Private-looking names that are public API: a named tuple's own methods.
NAMED_TUPLE_API = {"_replace", "_asdict", "_fields", "_make"}


def private_reads(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """Where ``tree`` reads a private attribute of an object other than its own (``self``,
    ``cls``, ``super()``), or imports a private name or module of the library."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_private(node.attr):
            owner = node.value
            own = (isinstance(owner, ast.Name) and owner.id in ("self", "cls")) or (
                isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name)
                and owner.func.id == "super")
            if not own and node.attr not in NAMED_TUPLE_API:
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("nous_inbox"):
            module = node.module or ""
            for alias in node.names:
                if is_private(alias.name) or any(map(is_private, module.split("."))):
                    yield node.lineno, f"from {module} import {alias.name}"


def test_tests_read_no_private_attribute() -> None:
    found: dict[object, str] = {}
    for path in sorted((PACKAGE.parent / "tests").rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent).as_posix()
        for line, read in private_reads(parsed(path)):
            found[(relative, read)] = f"{relative}:{line} reads {read}"
    held_to(found, dict(TEST_PRIVATES_ALLOWED), "a test drives public names only")
