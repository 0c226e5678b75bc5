"""Names: how the mailbox reads an agent's, a thread's or a message's name.

A name is its value: :func:`text` makes any ``str``, a subclass included, the plain ``str`` of its
value, and every name the mailbox stores or compares goes through it first. A subclass cannot
then pass for another agent, by its type (a check of ``type(name) is str`` lets it by) or by an
``__eq__`` or ``__hash__`` of its own (a dict asks the key it is given to compare itself).

>>> class Name(str): ...
>>> type(text(Name("dev"), "agent", "receive"))
<class 'str'>
>>> text(3, "agent", "receive")
Traceback (most recent call last):
...
TypeError: receive: agent must be a non-empty str, got 3
"""

from __future__ import annotations

__all__ = ["send_names", "text"]


def text(value: object, what: str, where: str) -> str:
    """``value``, a non-empty ``str``, as the plain ``str`` of its value; else a ``TypeError``
    naming ``what`` and ``where``."""
    if type(value) is str and value:
        return value
    # str.__str__ gives the value as a plain str, whatever the subclass overrides.
    plain = str.__str__(value) if isinstance(value, str) else None
    if not plain:
        raise TypeError(f"{where}: {what} must be a non-empty str, got {value!r}")
    return plain


def send_names(recipient: object, thread: object,
               correlation: object) -> tuple[str, str | None, str | None]:
    """A send's names (its ``recipient``, ``thread`` and ``correlation`` id) as plain ``str`` s,
    or the error naming the part that is not what it must be."""
    recipient = text(recipient, "recipient", "send")
    where = f"send to {recipient!r}"
    if thread is not None:
        thread = text(thread, "thread", where)
    if correlation is not None:
        if not isinstance(correlation, str):
            raise TypeError(f"{where}: correlation_id must be a str or None, "
                            f"got {correlation!r}")
        correlation = str.__str__(correlation)
    return recipient, thread, correlation
