"""What a host reads of a session it does not hold: store I/O, run on the host's store thread.

>>> from nous_inbox.events import SessionReleased
>>> from nous_inbox.store import open_store
>>> store = open_store("memory:")
>>> _ = store.append("s", [SessionReleased()])
>>> released_last(store, "s", caught_up(store, "s", None))
True
"""

from __future__ import annotations

from nous_inbox.events import Event, SessionReleased
from nous_inbox.owner.handover import last_run_event
from nous_inbox.session import Session, replay
from nous_inbox.store import Store
from nous_inbox.store.snapshot import load_session

__all__ = ["caught_up", "read_after", "released_last"]


def released_last(store: Store, session: str, known: Session) -> bool:
    """Whether the run's last word in ``session``'s log (as far as ``known``) is a
    ``SessionReleased``: its holder handed it over (the hand-over's rule)."""
    return type(last_run_event(store, session, known.version)) is SessionReleased


def read_after(store: Store, session: str, after: int) -> list[Event]:
    """The stored events of ``session`` with ``seq > after``."""
    return list(store.read(session, after))


def caught_up(store: Store, session: str, known: Session | None) -> Session:
    """``known`` with every event the store has after it folded in (replayed from the start, or
    from a snapshot, the first time)."""
    if known is None:
        return load_session(store, session).session
    version = store.version(session)
    if version == known.version:
        return known
    if version < known.version:  # deleted (and begun again) since
        return load_session(store, session).session
    return replay(store.read(session, known.version), start=known, stream=session)
