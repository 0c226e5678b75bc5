"""Adapters: the inbox behind the interfaces of agent frameworks people already use.

Each module here is a thin face over the library's own parts, named for the framework it serves
(``nous_inbox.adapters.aimu``, ...). Where a framework's protocol can be met by shape (aimu), importing
the adapter never imports the framework. Where the framework's extension point is a class to
subclass (pydantic-ai's capabilities), the adapter needs its extra installed, and importing it
without says which (``pip install 'nous-inbox[pydantic-ai]'``). This package itself imports nothing.
"""

__all__: list[str] = []
