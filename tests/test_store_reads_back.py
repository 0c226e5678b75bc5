"""The store's proof without a decode: an event it judges by its fields must really read back.

A store proves every event of an append reads back before it keeps it. For a send and a claim
holding only plain values (a ``Target``, a ``bool``, counts in range, a message of ASCII text
with no other field) it judges that by the exact types of the fields instead of decoding the
record again (``nous_inbox.store.base.proof.reads_back``). These tests hold that judgement to the
decoder: whatever it says yes to decodes back equal, however the event was built, altered
messages included; and a bad hand-built event is still refused by every store.
"""

from __future__ import annotations

import io
import math

import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nous_inbox.codec import JSON_LINES, MSGPACK
from nous_inbox.errors import ConcurrencyError
from nous_inbox.events import Event, MessageSent, QueueClaimed, Warned
from nous_inbox.message import Message
from nous_inbox.store import open_store
from nous_inbox.store.base.proof import reads_back
from nous_inbox.verbs import Target

_anything = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=6),
    st.sampled_from(list(Target)), st.sampled_from(["next_step", "user", "robot", ""]),
    st.builds(lambda: Message.user("x")), st.tuples(), st.lists(st.integers(), max_size=2),
)


@st.composite
def mostly(draw: st.DrawFn, good: st.SearchStrategy[object]) -> object:
    """A good value most of the time, anything plausible otherwise."""
    return draw(good) if draw(st.integers(0, 9)) else draw(_anything)


@st.composite
def messages(draw: st.DrawFn) -> object:
    """A message built the proper way, sometimes altered past its checks, or not a message."""
    if draw(st.integers(0, 19)) == 0:
        return draw(_anything)
    message = Message(draw(st.sampled_from(["user", "assistant", "system", "tool"])),
                      draw(st.text(max_size=8) | st.text("ab c", max_size=8) | st.text("ab c", max_size=8)),
                      name=draw(st.none() | st.none() | st.text(max_size=3)),
                      metadata=draw(st.sampled_from([{}, {}, {"k": 1}])))
    if draw(st.integers(0, 3)) == 0:  # force_setattr: what no constructor lets through
        field = draw(st.sampled_from(Message.__struct_fields__))
        msgspec.structs.force_setattr(message, field, draw(_anything))
    return message


@st.composite
def events(draw: st.DrawFn) -> Event:
    seq = draw(mostly(st.integers(0, 10**6) | st.integers(0, 2**64)))
    at = draw(mostly(st.floats(allow_nan=False, allow_infinity=False) | st.floats()))
    target = draw(mostly(st.sampled_from(list(Target))))
    if draw(st.booleans()):
        return MessageSent(target=target, wakeup=draw(mostly(st.booleans())),  # type: ignore[arg-type]
                           message=draw(messages()), seq=seq, at=at)  # type: ignore[arg-type]
    return QueueClaimed(target=target,  # type: ignore[arg-type]
                        count=draw(mostly(st.integers(0, 9) | st.integers(-2, 2**64))),  # type: ignore[arg-type]
                        rest=draw(mostly(st.integers(0, 9) | st.integers(-2, 2**64))),  # type: ignore[arg-type]
                        seq=seq, at=at)  # type: ignore[arg-type]


def _blank_called_not_blank(content: str) -> MessageSent:
    message = Message("user", content)
    msgspec.structs.force_setattr(message, "blank", False)  # what no constructor lets through
    return MessageSent(target=Target.NEXT_TURN, wakeup=False, message=message, at=0.0)


@settings(max_examples=1500, deadline=None)
@given(event=events())
@example(event=_blank_called_not_blank(""))
@example(event=_blank_called_not_blank(" \n"))
def test_an_event_judged_by_its_fields_decodes_back_equal_in_both_formats(event):
    if not reads_back(event):
        return
    for fmt in (MSGPACK, JSON_LINES):
        assert fmt.decoder(Event).decode(fmt.encode(event)) == event


def test_a_plain_send_and_claim_are_judged_by_their_fields():
    sent = MessageSent(target=Target.NEXT_STEP, wakeup=False, message=Message.user("go"),
                       seq=1, at=1.5)
    claim = QueueClaimed(target=Target.NEXT_STEP, count=1, seq=2, at=1.5)
    assert reads_back(sent) and reads_back(claim)


@pytest.mark.parametrize("event", [
    MessageSent(target=Target.NEXT_STEP, wakeup=True, message=Message.user("é"), seq=1, at=1.5),
    MessageSent(target=Target.NEXT_STEP, wakeup=True,
                message=Message.user("x", metadata={"k": 1}), seq=1, at=1.5),
    MessageSent(target="next_step", wakeup=True, message=Message.user("x"), seq=1, at=1.5),
    MessageSent(target=Target.NEXT_STEP, wakeup=1, message=Message.user("x"), seq=1, at=1.5),
    QueueClaimed(target=Target.NEXT_STEP, count=-1, seq=1, at=1.5),
    QueueClaimed(target=Target.NEXT_STEP, count=True, seq=1, at=1.5),
    QueueClaimed(target=Target.NEXT_STEP, count=1, seq=1, at=math.nan),
    Warned(text="x", seq=1, at=1.5),
], ids=["non-ASCII text", "metadata", "a str target", "an int wakeup", "a negative count",
        "a bool count", "a NaN time", "another event type"])
def test_anything_else_is_decoded_and_compared(event):
    assert not reads_back(event)


@pytest.mark.parametrize("field, value", [("content", 5), ("role", "robot"),
                                          ("content", "\ud800"), ("tool_calls", [1])])
def test_a_message_altered_past_its_checks_is_still_refused_by_every_store(url, field, value):
    message = Message.user("fine")
    msgspec.structs.force_setattr(message, field, value)
    with open_store(url) as store:
        with pytest.raises((TypeError, ValueError), match=r"append to 's': events\[0\]"):
            store.append("s", [MessageSent(target=Target.NEXT_STEP, wakeup=True, message=message)])
        assert store.version("s") == 0


def test_the_proof_names_every_field_of_the_types_it_judges():
    # A field added later to one of these types would fall outside reads_back's checks; the
    # module refuses to import until the proof names it.
    from nous_inbox.store.base.proof import PROVEN_FIELDS, check_proof

    assert set(PROVEN_FIELDS) == {MessageSent, QueueClaimed, Message}
    check_proof(PROVEN_FIELDS)  # the proof as shipped passes
    short = dict(PROVEN_FIELDS)
    short[Message] = PROVEN_FIELDS[Message] - {"tool_calls"}
    with pytest.raises(ImportError, match=r"judges .* of Message, which has .*'tool_calls'.*: "
                                          r"extend the proof to every field"):
        check_proof(short)


# -- memory: proves a send or claim as the durable stores do, the size limit exact --------------


@pytest.mark.parametrize("kind", ["send", "claim"])
def test_memory_holds_a_proven_event_to_the_record_limit_to_the_byte(kind):
    # An event that encodes to the limit is kept; one byte over it, refused and nothing kept.
    if kind == "claim":
        event: Event = QueueClaimed(target=Target.NEXT_STEP, count=0, rest=0, seq=1, at=1.5)
    else:
        event = MessageSent(target=Target.NEXT_STEP, wakeup=True,
                            message=Message.user("x" * 100), seq=1, at=1.5)
    exact = len(MSGPACK.encode(event))
    for limit, kept in ((exact, True), (exact - 1, False), (10**6, True)):
        store = open_store("memory:")
        store.max_record_size = limit
        if kept:
            assert store.append("s", [event]) == [event]
        else:
            with pytest.raises(ValueError, match="above the limit"):
                store.append("s", [event])
            assert store.version("s") == 0


def test_memory_numbers_and_times_a_proven_event_as_every_store_does():
    store = open_store("memory:")
    sent = MessageSent(target=Target.NEXT_STEP, wakeup=True, message=Message.user("go"))
    (first,) = store.append("s", [sent])
    (second,) = store.append("s", (sent,), expected_version=1)
    assert (first.seq, second.seq) == (1, 2) and first.at > 0 and type(first.at) is float
    claim = QueueClaimed(target=Target.NEXT_STEP, count=2, seq=7, at=3.5)
    (third,) = store.append("s", [claim])
    assert (third.seq, third.at) == (3, 3.5)
    assert list(store.read("s")) == [first, second, third]
    with pytest.raises(ConcurrencyError):
        store.append("s", [sent], expected_version=1)
    with pytest.raises(ValueError, match="expected_version"):
        store.append("s", [sent], expected_version=True)
    assert store.version("s") == 3 and store.version("other") == 0
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.append("s", [sent])
    with pytest.raises(ValueError, match="closed"):
        store.version("s")
    with pytest.raises(io.UnsupportedOperation):
        open_store("memory:", read_only=True).append("s", [sent])


def test_a_memory_store_subclass_that_overrides_a_hook_sees_every_append():
    from nous_inbox.store.memory import MemoryStore

    class Mirrored(MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.written: list[Event] = []

        def _write(self, stream, events, records, *, batch=None):
            self.written.extend(events)
            super()._write(stream, events, records, batch=batch)

    store = Mirrored()
    (sent,) = store.append("s", [MessageSent(target=Target.NEXT_STEP, wakeup=True,
                                             message=Message.user("go"))])
    assert store.written == [sent] and store.version("s") == 1


def test_a_memory_store_subclass_writing_json_lines_is_held_to_its_own_limit():
    # The limit holds for the records the store writes: JSON Lines writes "\x01" as six bytes.
    from nous_inbox.store.memory import MemoryStore

    class JsonMemory(MemoryStore):
        _format = JSON_LINES

    store = JsonMemory()
    store.max_record_size = 1000
    store.append("s", [MessageSent(target=Target.NEXT_STEP, wakeup=True,
                                   message=Message.user("hi"))])
    with pytest.raises(ValueError, match="above the limit of 1000 bytes"):
        store.append("s", [MessageSent(target=Target.NEXT_STEP, wakeup=True,
                                       message=Message.user("\x01" * 800))])
    assert store.version("s") == 1


def test_a_memory_store_subclass_that_holds_streams_through_appending_sees_every_append():
    # With _lock_excludes off, StoreBase holds each append through _appending (a cross-process
    # lock, a transaction, an audit): no append may skip it.
    import contextlib

    from nous_inbox.store.memory import MemoryStore

    class Held(MemoryStore):
        _lock_excludes = False

        def __init__(self) -> None:
            super().__init__()
            self.held = 0

        @contextlib.contextmanager
        def _appending(self, stream):
            self.held += 1
            yield self._version(stream)

    store = Held()
    sent = MessageSent(target=Target.NEXT_STEP, wakeup=True, message=Message.user("go"))
    claim = QueueClaimed(target=Target.NEXT_STEP, count=1)
    for event in (sent, sent, claim):
        store.append("s", [event])
    assert store.held == 3 and store.version("s") == 3


def test_a_message_whose_blankness_no_longer_matches_its_text_is_decoded_not_judged():
    # Blankness is decided when a message is built, and decided again when it is decoded: a
    # message altered past its checks keeps a stale answer, which its record would not read
    # back with. A blank message built the proper way reads back as it is.
    stale = Message.user("a")
    msgspec.structs.force_setattr(stale, "content", "")
    for message, judged in ((stale, False), (Message.user(" \n"), True), (Message.user(""), True)):
        event = MessageSent(target=Target.NEXT_STEP, wakeup=True, message=message, seq=1, at=1.0)
        assert reads_back(event) is judged
        for fmt in (MSGPACK, JSON_LINES):
            assert (fmt.decoder(Event).decode(fmt.encode(event)) == event) is judged
