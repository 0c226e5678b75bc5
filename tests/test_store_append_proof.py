"""A store acknowledges only what it can read back: a bad hand-built event is refused at append.

msgspec does not check field types when a Struct is built, so an event can be built holding a
bare ``str`` where a message belongs, an unknown target, a ``wakeup`` that is not a bool. Each
store proves every event of an append decodes back equal before it writes; what does not is
refused with a clear error naming the event, nothing is written, and the other sessions of the
store stay readable. The last test fuzzes the append path: any event built by any means is
either refused at append or read back equal.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Iterator

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nous_inbox.events import (
    EVENT_TYPES,
    Event,
    MailSent,
    MessageSent,
    QueueClaimed,
    TurnEnded,
    TurnStarted,
    Warned,
)
from nous_inbox.message import Message, ToolCall
from nous_inbox.store import open_store
from nous_inbox.store.base import StoreBase
from nous_inbox.store.lease import Leases
from nous_inbox.verbs import Target

STRESS = int(os.environ.get("NOUS_INBOX_STRESS", "1") or 1)

BAD_EVENTS = {
    "a bare str message": MessageSent(target=Target.NEXT_STEP, wakeup=True, message="hi"),
    "an unknown target": MessageSent(target="next_week", wakeup=True, message=Message.user("x")),
    "wakeup='yes'": MessageSent(target=Target.NEXT_STEP, wakeup="yes", message=Message.user("x")),
    "Warned(text=5)": Warned(text=5),
    "at=nan": Warned(text="x", at=math.nan),
    "at=inf": Warned(text="x", at=math.inf),
    "at='now'": Warned(text="x", at="now"),
    "a str count": QueueClaimed(target=Target.NEXT_STEP, count="2"),
    "an unknown end reason": TurnEnded(turn=1, steps=1, reason="bored"),
    "a lone surrogate": Warned(text="\ud800"),
    "an object in a str field": Warned(text=object()),
    "an int beyond 64 bits": TurnStarted(turn=2**70),
    "a bool turn": TurnStarted(turn=True),
    "a negative claim count": QueueClaimed(target=Target.NEXT_STEP, count=-5),
    "a negative claim rest": QueueClaimed(target=Target.NEXT_STEP, count=1, rest=-1),
    "a negative turn": TurnStarted(turn=-1),
    "a negative step count": TurnEnded(turn=1, steps=-2, reason="final"),
    "at beyond any float": Warned(text="x", at=10**400),
}


@pytest.mark.parametrize("event", BAD_EVENTS.values(), ids=BAD_EVENTS.keys())
def test_a_bad_hand_built_event_is_refused_at_append_and_nothing_is_written(store, event):
    store.append("s", [Warned(text="before")])
    with pytest.raises((TypeError, ValueError), match=r"append to 's': events\[1\]"):
        store.append("s", [Warned(text="fine"), event])
    assert store.version("s") == 1
    assert [e.text for e in store.read("s")] == ["before"]


def test_a_time_beyond_any_float_is_a_clear_value_error(store):
    with pytest.raises(ValueError, match=r"events\[0\]\.at must be a finite number"):
        store.append("s", [Warned(text="x", at=10**400)])


def nested(depth: int) -> list[object]:
    tree: list[object] = []
    for _ in range(depth - 1):
        tree = [tree]
    return tree


@pytest.mark.parametrize("body", [b"bytes", {1: 2}, {"a": {3}}, nested(65), nested(2000)],
                         ids=["bytes", "an int key", "a set", "65 deep", "2000 deep"])
def test_a_mail_body_gets_the_check_the_mailbox_send_makes_on_every_store(store, body):
    with pytest.raises((TypeError, ValueError), match=r"events\[0\] \(MailSent\) body"):
        store.append("m", [MailSent(id="1", sender="a", recipient="b", body=body)])
    assert store.version("m") == 0


def test_a_mail_body_as_deep_as_a_send_allows_is_stored(store):
    store.append("m", [MailSent(id="1", sender="a", recipient="b", body=nested(64))])
    assert next(iter(store.read("m"))).body == nested(64)


def test_a_body_too_deep_to_encode_is_refused_not_a_recursion_error(store):
    event = MailSent(id="1", sender="a", recipient="b")
    msgspec.structs.force_setattr(event, "body", nested(100_000))  # past the build-time check
    with pytest.raises(ValueError, match=r"nested"):  # not a RecursionError
        store.append("m", [event])
    assert store.version("m") == 0


def test_a_stream_name_without_a_utf8_form_is_refused_by_every_store(store):
    for call in (lambda: store.append("a\udc80", [Warned(text="x")]),
                 lambda: store.version("a\udc80"), lambda: list(store.read("a\udc80"))):
        with pytest.raises(ValueError, match=r"stream name .* has no UTF-8 form"):
            call()
    assert store.streams() == []


def test_the_refusal_names_the_field_at_fault(store):
    with pytest.raises(ValueError, match=r"events\[0\] \(MessageSent\).*\$\.message"):
        store.append("s", [MessageSent(target=Target.NEXT_STEP, wakeup=True, message="hi")])


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_refused_event_never_takes_other_sessions_down(kind, url):
    with open_store(url) as store:
        with pytest.raises(ValueError):
            store.append("a", [MessageSent(target=Target.NEXT_STEP, wakeup=True, message="hi")])
        store.append("b", [Warned(text="x")])
    with open_store(url) as store:  # reopened: nothing poisoned the log
        assert store.version("a") == 0
        assert [e.text for e in store.read("b")] == ["x"]
        store.append("b", [Warned(text="y")])
        assert store.version("b") == 2


def test_an_int_time_is_kept_as_a_float(store):
    stored = store.append("s", [Warned(text="x", at=5)])
    assert stored[0].at == 5.0 and type(stored[0].at) is float
    assert list(store.read("s")) == stored


# -- the template: a new store implements only hooks ----------------------------------------------


class DictStore(StoreBase):
    """The smallest store on the template: the hooks over a dict of encoded records."""

    url = "dict:"

    def __init__(self) -> None:
        self.read_only = False
        self._lock = threading.Lock()
        self._leases = Leases(self.url, None)
        self._rows: dict[str, list[bytes]] = {}
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("dict: store is closed")

    @contextlib.contextmanager
    def _appending(self, stream: str) -> Iterator[int]:
        yield len(self._rows.get(stream, ()))

    def _write(self, stream: str, events: list[Event], records: list[bytes]) -> None:
        self._rows.setdefault(stream, []).extend(records)

    def _read(self, stream: str, after: int) -> Iterator[Event]:
        return iter([self._decode(stream, row) for row in self._rows.get(stream, [])[after:]])

    def _version(self, stream: str) -> int:
        return len(self._rows.get(stream, ()))

    def _stream_names(self) -> list[str]:
        return sorted(self._rows)

    def _close(self) -> None:
        self._closed = True


def test_a_store_written_as_hooks_gets_every_shared_rule():
    from nous_inbox.errors import ConcurrencyError

    with DictStore() as store:
        stored = store.append("s", [Warned(text="a"), Warned(text="b")], expected_version=0)
        assert [e.seq for e in stored] == [1, 2] and stored[0].at > 0
        assert list(store.read("s", after=1)) == stored[1:]
        with pytest.raises(ConcurrencyError):
            store.append("s", [Warned(text="c")], expected_version=0)
        with pytest.raises(ValueError, match="stream name"):
            store.append("", [Warned(text="c")])
        with pytest.raises(ValueError, match="Warned"):
            store.append("s", [Warned(text=5)])
        assert store.streams() == ["s"] and store.version("s") == 2
    with pytest.raises(ValueError, match="closed"):
        store.version("s")


# -- the fuzz: refused at append, or read back equal -----------------------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8),
    st.sampled_from(list(Target)), st.sampled_from(["next_step", "final", "wake", "prompt"]),
)
_messages = st.builds(Message.user, st.text(max_size=8))
_calls = st.builds(ToolCall, st.text(max_size=4), st.text(max_size=4))
_values = st.one_of(_scalars, _messages, _calls, st.lists(_scalars, max_size=2),
                    st.dictionaries(st.text(max_size=3), _scalars, max_size=2))


@st.composite
def any_event(draw: st.DrawFn) -> Event:
    """An event of any type whose every field holds a value drawn from anything plausible."""
    kind = draw(st.sampled_from(EVENT_TYPES))
    fields = {}
    for name in kind.__struct_fields__:
        if name in ("seq", "at") and draw(st.booleans()):
            continue  # leave some defaults alone
        fields[name] = draw(_values)
    try:
        return kind(**fields)
    except (TypeError, ValueError):  # a constructor that checks (none do today) refused it
        return Warned(text="fallback")


@settings(max_examples=150 * STRESS, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(events=st.lists(any_event(), min_size=1, max_size=3))
def test_any_event_is_refused_at_append_or_read_back_equal(store, events):
    before = store.version("s")
    try:
        stored = store.append("s", events)
    except (TypeError, ValueError):
        assert store.version("s") == before
        return
    assert list(store.read("s", after=before)) == stored
