"""The Store protocol and the helpers every store shares: names, identities, checks, defaults.

:class:`Store` is what the owner and the CLI need of a place that keeps event logs; the rest
is what a store checks before it writes (a stream's name, an expected version, the events), the
errors it refuses with, and where the default store lives. :class:`~nous_inbox.store.base.StoreBase`
makes every check for a store built on it; one written without it calls these, so every store
refuses alike. The package's docstring (:mod:`nous_inbox.store.base`) says the
rules every store keeps.
"""

from __future__ import annotations

import io
import math
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Final, NamedTuple, Protocol, cast, runtime_checkable

import msgspec

from nous_inbox.codec import MAX_STREAM_NAME
from nous_inbox.errors import ConcurrencyError, OutcomeUnknownError, StoreError
from nous_inbox.events import EVENT_TYPES, Event, MailSent
from nous_inbox.frozen import freeze_json
from nous_inbox.store.lease import OwnerLease

__all__ = [
    "STORE_ENV",
    "Moved",
    "Store",
    "StoreLockedError",
    "append_identity",
    "append_once",
    "check_expected_version",
    "check_max_record_size",
    "check_stream",
    "checked_events",
    "default_store_path",
    "default_store_url",
    "number_events",
    "read_only_error",
    "version_conflict",
]

STORE_ENV: Final = "NOUS_INBOX_STORE"
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_INF: Final = math.inf
_EVENT_TYPES: Final = frozenset(EVENT_TYPES)
_replace: Final = msgspec.structs.replace
_GOOD_STREAMS: Final[dict[str, None]] = {}  # names check_stream has passed, as a set
_GOOD_STREAMS_KEPT: Final = 4096
#: The namespace of the identities made from a caller's own key (see :func:`append_identity`).
_IDENTITIES: Final = uuid.UUID("5a0a5b9e-6f1e-4c56-9d1e-6e6f75732d69")


class StoreLockedError(ConcurrencyError):
    """Another writer held the store for longer than the lock timeout; nothing was written."""


class Moved(NamedTuple):
    """What :meth:`Store.moved` answers: the streams that moved, and the cursor of this look.

    ``full``: ``streams`` is every stream that has events (the first look, or one the store
    could not answer from its cursor); else only those whose log changed since.

    >>> Moved(["s1"], 7, False).streams
    ['s1']
    """

    streams: list[str]
    cursor: object
    full: bool


@runtime_checkable
class Store(Protocol):
    """What the owner and the CLI need from a place that keeps event logs."""

    def append(
        self, stream: str, events: Sequence[Event], expected_version: int | None = None,
        *, identity: str | uuid.UUID | None = None,
    ) -> list[Event]:
        """Append ``events`` to ``stream`` atomically and return them as stored.

        The store numbers them ``version + 1, version + 2, ...`` (any ``seq`` the caller set is
        ignored) and stamps ``at`` with the current time where the caller left ``0.0``. If
        ``expected_version`` is given and is not the stream's version, raise
        ``ConcurrencyError`` and write nothing. An event the store could not read back equal
        is refused (``TypeError`` or ``ValueError``) and nothing is written. An empty list is a
        no-op returning ``[]``.

        ``identity`` (see :func:`append_identity`) names the append: an append with an identity
        already written to ``stream`` writes nothing and returns the events stored then, before
        any version check. So an append whose outcome is unknown
        (:class:`~nous_inbox.errors.OutcomeUnknownError`, a call cancelled in its thread) is
        retried with the same identity and written once. A server store keeps identities with
        the events; a local one remembers those of its last 4096 appends made with one, for as
        long as it is open (a local append's outcome is known to the process that made it).
        """

    def read(self, stream: str, after: int = 0) -> Iterator[Event]:
        """The events of ``stream`` with ``seq > after``, in order (none for an unknown stream)."""

    def version(self, stream: str) -> int:
        """The last ``seq`` of ``stream`` (0 if it has none); cheap enough to poll."""

    def streams(self) -> list[str]:
        """The names of the streams that have events, sorted."""

    def moved(self, since: object = None) -> Moved:
        """The streams whose log changed (an append, a delete) since the look that gave the
        cursor ``since``, sorted, with the cursor for the next look: what a host polls to find
        the sessions that want a wake, so it costs what changed, not what is stored.

        ``since=None`` (the first look), or a cursor the store can no longer answer from (its
        file was rewritten by a delete), gives a full answer (``full=True``): every stream that
        has events. An answer may name a stream that did not change; it never misses one that
        did, whichever store instance or process wrote it. A cursor is opaque: pass back what
        the last answer of this store gave (another is a ``ValueError``).
        """

    def delete(self, stream: str) -> None:
        """Remove ``stream``'s events and snapshot, all at once; nothing for an unknown stream.

        Afterwards the stream has version 0, reads nothing, is not in :meth:`streams`, and its
        next append is numbered 1. Made under the stream's owner lease: the caller's, when it
        holds it through this store, else taken for the delete; ``StreamOwnedError`` when
        another owner holds it. A store opened read-only refuses with ``ValueError``.
        """

    def own(self, stream: str) -> OwnerLease:
        """Take ``stream``'s owner lease, or raise ``StreamOwnedError`` if another owner holds it.

        The lease holds across store instances, threads and processes until it is released or
        its store is closed. When its process dies (even by SIGKILL), a local store's lease
        (``file:``, ``sqlite:``) dies with it at once; a server's (``postgresql:``) expires a
        lease time after its last renewal, and an owner whose expired lease was taken over is
        refused with ``LeaseLostError``. A store opened read-only refuses with ``ValueError``.
        """

    def close(self) -> None:
        """Release files, locks, leases and connections; the store is unusable afterwards."""

    def __enter__(self) -> Store: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the store on leaving a ``with`` block."""


def check_stream(stream: object) -> str:
    """Return ``stream`` if it is a valid stream name, else raise ``ValueError`` naming it.

    >>> check_stream("session-1")
    'session-1'
    >>> check_stream("a\\nb")
    Traceback (most recent call last):
    ...
    ValueError: stream name 'a\\nb' contains a control character at index 1
    """
    if type(stream) is str and stream in _GOOD_STREAMS:
        return stream
    if not isinstance(stream, str):
        raise ValueError(f"stream name must be a str, got {type(stream).__name__}: {stream!r}")
    if not stream:
        raise ValueError("stream name must not be empty")
    if len(stream) > MAX_STREAM_NAME:
        raise ValueError(
            f"stream name {stream[:40]!r}... is {len(stream)} characters long "
            f"(at most {MAX_STREAM_NAME})"
        )
    if not stream.isascii():
        try:
            stream.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"stream name {stream!r} has no UTF-8 form (a lone surrogate at index "
                f"{exc.start}), so no store can write it"
            ) from None
    bad = _CONTROL.search(stream)
    if bad is not None:
        raise ValueError(
            f"stream name {stream!r} contains a control character at index {bad.start()}"
        )
    if type(stream) is str:
        # Every append, read and poll names its stream: one already found good is looked up
        # rather than checked again. Bounded, so a host naming endless streams keeps no more.
        if len(_GOOD_STREAMS) >= _GOOD_STREAMS_KEPT:
            _GOOD_STREAMS.clear()
        _GOOD_STREAMS[stream] = None
    return stream


def append_identity(identity: object) -> uuid.UUID:
    """The identity of an append as the stores keep it: a ``uuid.UUID`` as it is; a ``str``
    that spells a UUID, that UUID; any other non-empty ``str`` (a key of the caller's own), a
    UUID made from it. Anything else is a ``TypeError``.

    >>> append_identity("send-42") == append_identity("send-42") != append_identity("send-43")
    True
    """
    if type(identity) is uuid.UUID:
        return identity
    if type(identity) is str and identity:
        try:
            return uuid.UUID(identity)
        except ValueError:
            return uuid.uuid5(_IDENTITIES, identity)
    raise TypeError(f"an append's identity must be a uuid.UUID or a non-empty str, "
                    f"got {identity!r}")


class _Appends(Protocol):
    """Anything that appends as a store does (a journal's log may be a host's own)."""

    def append(self, stream: str, events: Sequence[Event],
               expected_version: int | None = None) -> Sequence[Event]: ...


def append_once(
    store: Store | _Appends, stream: str, events: Sequence[Event],
    expected_version: int | None = None, *, tries: int = 3,
) -> list[Event]:
    """``store.append``, written once whatever its outcome: an append whose outcome the store
    could not learn (:class:`~nous_inbox.errors.OutcomeUnknownError`) is made again with the
    identity the error gives, up to ``tries`` attempts in all, then that error is raised. Every
    other error of the first attempt means nothing was written, and is raised at once; a retry's
    ``StoreError`` leaves the first attempt's outcome unknown, so it is raised as one. (The
    first attempt names no identity, so it costs what any append costs.)

    >>> from nous_inbox.store import open_store
    >>> from nous_inbox.events import Warned
    >>> [e.seq for e in append_once(open_store("memory:"), "s", [Warned(text="a")])]
    [1]
    """
    append: Any = store.append  # (only a store that raised OutcomeUnknownError takes identity)
    try:
        stored = append(stream, events, expected_version)
        # A list is handed on as it is (the stores build a fresh one for each append; a journal's
        # log hands back the list the journal built): only another sequence is copied.
        return stored if type(stored) is list else list(stored)
    except OutcomeUnknownError as unknown:
        for left in range(tries - 1, 0, -1):
            try:
                return list(append(stream, events, expected_version, identity=unknown.identity))
            except OutcomeUnknownError as again:
                if left == 1:
                    raise again from unknown
            except StoreError as refused:  # this try wrote nothing; the first one may have
                raise OutcomeUnknownError(
                    f"{unknown}; retried with its identity, then: {refused}".replace(
                        "; nothing was written", ""),
                    stream=unknown.stream, identity=unknown.identity) from refused
        raise


def check_max_record_size(url: str, value: object) -> int:
    """``value`` if it is a store's ``max_record_size`` (an int >= 1, in bytes), else raise,
    naming it: checked when a store opens, because the runner holds tool results to the limit
    the store says, and a limit the store enforces differently would end a turn instead.

    >>> check_max_record_size("memory:", 4096)
    4096
    >>> check_max_record_size("memory:", 65536.0)
    Traceback (most recent call last):
    ...
    TypeError: memory:: max_record_size must be an int >= 1 (bytes), got 65536.0
    """
    if type(value) is not int:  # a bool, a float: refused, not rounded
        raise TypeError(f"{url}: max_record_size must be an int >= 1 (bytes), got {value!r}")
    if value < 1:
        raise ValueError(f"{url}: max_record_size must be an int >= 1 (bytes), got {value!r}")
    return value


def check_expected_version(expected_version: object) -> None:
    """Refuse an ``expected_version`` that is neither ``None`` nor a non-negative ``int``.

    >>> check_expected_version(-1)
    Traceback (most recent call last):
    ...
    ValueError: expected_version must be None or an int >= 0, got -1
    """
    if expected_version is None:
        return
    if type(expected_version) is not int or expected_version < 0:
        raise ValueError(
            f"expected_version must be None or an int >= 0, got {expected_version!r}"
        )


def version_conflict(stream: str, expected: int, actual: int) -> ConcurrencyError:
    """The error for an append whose expected version is stale: raised with nothing written.

    >>> print(version_conflict("s", 3, 4))
    stream 's': expected version 3 but it is at 4 (another writer appended first); nothing was written
    """
    return ConcurrencyError(
        f"stream {stream!r}: expected version {expected} but it is at {actual} "
        f"(another writer appended first); nothing was written"
    )


def read_only_error(url: str) -> io.UnsupportedOperation:
    """The error for an ``append`` or ``own`` on a store opened read-only (a ``ValueError``)."""
    return io.UnsupportedOperation(f"{url} was opened read-only")


def checked_events(stream: str, events: object) -> Sequence[Event]:
    """``events``, if it is a sequence of events with finite times (and a mail body a log can
    hold); else a ``TypeError`` or ``ValueError`` naming the index, before anything is written.

    >>> checked_events("s", ["hi"])
    Traceback (most recent call last):
    ...
    TypeError: append to 's': events[0] is a str, not an event
    """
    shape = type(events)
    if shape is not list and shape is not tuple and (  # (the ABC check costs as much as the rest)
        isinstance(events, (str, bytes)) or not isinstance(events, Sequence)
    ):
        raise TypeError(
            f"append to {stream!r}: events must be a sequence of events, "
            f"got {type(events).__name__}"
        )
    checked = cast(Sequence[Event], events)
    kinds = _EVENT_TYPES
    for i, event in enumerate(checked):
        kind = type(event)
        if kind not in kinds:
            raise TypeError(
                f"append to {stream!r}: events[{i}] is a {type(event).__name__}, not an event"
            )
        at = event.at
        if type(at) is float and -_INF < at < _INF and kind is not MailSent:
            continue  # the common case, every check below passed
        if type(event) is MailSent and event.body is not None:
            # The check the mailbox's send makes (JSON-able, str keys, at most MAX_DEPTH deep):
            # a body built by hand is refused here by every store alike. Here, not when the
            # event is built, so replay does not walk every body again as it decodes.
            freeze_json(event.body, f"append to {stream!r}: events[{i}] (MailSent) body")
        if not (type(at) is float and -_INF < at < _INF) and (  # NaN fails both comparisons
            type(at) is bool or not isinstance(at, (int, float)) or not _finite(at)
        ):
            raise ValueError(
                f"append to {stream!r}: events[{i}].at must be a finite number of seconds, "
                f"got {at!r}; nothing was written"
            )
    return checked


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an int beyond any float (10**400)
        return False


def number_events(events: Sequence[Event], version: int, now: float | None = None) -> list[Event]:
    """Checked events (:func:`checked_events`) as the store keeps them: ``seq`` from
    ``version + 1``, and ``at``, where an event has none, the time of the append (``now``).

    >>> from nous_inbox.events import Warned
    >>> [(e.seq, e.at) for e in number_events([Warned(text="x", seq=9)], 4, now=1.5)]
    [(5, 1.5)]
    """
    numbered = []
    for event in events:
        version += 1
        at = event.at
        # An event numbered and timed already (a journal does so before it folds) is kept as
        # it is: the copy would be equal.
        if type(event.seq) is not int or event.seq != version or type(at) is not float or not at:
            if not at:
                if now is None:
                    now = time.time()  # once an append, and only when some event needs it
                at = now
            event = _replace(event, seq=version, at=float(at))
        numbered.append(event)
    return numbered


def default_store_path() -> Path:
    """Where the default SQLite store lives: ``$XDG_STATE_HOME/nous-inbox/inbox.sqlite``.

    ``XDG_STATE_HOME`` defaults to ``~/.local/state`` (a relative value is ignored, as the XDG
    specification asks). Does not create anything.
    """
    state = os.environ.get("XDG_STATE_HOME", "")
    base = Path(state) if state and os.path.isabs(state) else Path.home() / ".local" / "state"
    return base / "nous-inbox" / "inbox.sqlite"


def default_store_url() -> str:
    """The store to use when none is named: ``$NOUS_INBOX_STORE`` if set, else a private SQLite file.

    The SQLite file is :func:`default_store_path`; its directory is created (mode 0700) so the
    store can be opened straight away.
    """
    url = os.environ.get(STORE_ENV, "")
    if url:
        return url
    path = default_store_path()
    if not path.parent.is_dir():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o700)  # mkdir's mode is filtered by the umask
    return f"sqlite:{path}"
