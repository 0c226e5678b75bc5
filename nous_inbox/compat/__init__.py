"""Adapters: the inbox behind the interfaces of agent frameworks people already use.

Each module here is a thin face over the library's own parts, named for the framework it serves
(``nous_inbox.compat.aimu``, ...). Importing one never imports its framework: an adapter satisfies
the framework's protocol by shape, so it can be built, tested and type-checked without the
framework installed. This package itself imports nothing.
"""

__all__: list[str] = []
