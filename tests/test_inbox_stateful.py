"""The inbox against the plainest model of it that could work: two lists of (message, wakeup).

Hypothesis drives random sequences of sends (every target and wake flag, as plain strings and as
``Target``, blank messages among them, numbered by a seq or not), the three presets, claims (whole,
of the oldest few, and wake-only), withdraws (of a queued entry, and of a seq no entry holds),
JSON and MessagePack round trips and returns to an earlier value. After every step it
checks that the ``Inbox`` agrees with the model on ``count``, ``has_pending``, ``wants_wake``,
``worth_waking`` (each per queue and overall) and the queued entries, and that equal contents give an equal value
with an equal hash. The value is persistent, so no operation may change an inbox another came from:
the value just operated on is checked after every step, and **every earlier value** at the end of
each run. (The model keeps its two lists as tuples so each remembered state stays as it was.)

The default run is fast (``max_examples=150``, 30 steps). ``test_inbox_machine_stress`` is marked
``slow`` and runs a longer search (``60 * N`` examples of ``60 + 10 * N`` steps) where ``N`` is the
environment variable ``NOUS_INBOX_STRESS`` (default 1), e.g.
``NOUS_INBOX_STRESS=20 pytest -m slow tests/test_inbox_stateful.py``.
"""

from __future__ import annotations

import os
import unicodedata
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from nous_inbox import Inbox, Message, Target

TURN, STEP = "next_turn", "next_step"
TargetName = str
ModelEntry = tuple[Message, bool, int]  # (message, wakeup, seq: 0 when unnumbered)

_STRESS = max(1, int(os.environ.get("NOUS_INBOX_STRESS", "1")))

# -- what gets sent ---------------------------------------------------------------------------------

_json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
_json = st.recursive(
    _json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=4,
)
_messages = st.builds(
    Message,
    role=st.sampled_from(["system", "user", "assistant", "tool"]),
    content=st.text(max_size=20),
    name=st.none() | st.text(max_size=5),
    metadata=st.dictionaries(st.text(max_size=5), _json, max_size=2),
    id=st.none() | st.text(max_size=5),
)
# Mostly drawn from a small fixed pool, which keeps the run fast and makes equal messages (and so
# equal inboxes) common; sometimes a freshly generated message with arbitrary JSON metadata.
_POOL = [
    Message.system("be brief"),
    Message.assistant("calling", tool_calls=[{"id": "c1", "name": "ls", "arguments": {"d": "/"}}]),
    Message.tool("3 files", "c1"),
    Message.user("ctx", name="leo", metadata={"k": [1, {"x": None}], "f": 1.5, "big": 2**64 - 1}),
]
_sendable = st.one_of(
    st.sampled_from(["a", "b", "stop", "é ✓"]),
    st.sampled_from(["", " ", "\n\t", "\u200b", " \ufeff\u2060", Message.assistant(" ")]),  # blank
    st.sampled_from(_POOL),
    st.text(max_size=4),
    _messages,
)
_targets = st.sampled_from([TURN, STEP, Target.NEXT_TURN, Target.NEXT_STEP])


def _visible(text: str) -> bool:
    return any(not c.isspace() and unicodedata.category(c) != "Cf" for c in text)


def _as_message(sendable: Message | str) -> Message:
    return Message.user(sendable) if isinstance(sendable, str) else sendable


@dataclass(frozen=True)
class _Model:
    """The reference: two tuples of (message, wakeup, seq), in send order."""

    turn: tuple[ModelEntry, ...] = ()
    step: tuple[ModelEntry, ...] = ()

    def queue(self, target: TargetName) -> tuple[ModelEntry, ...]:
        return self.step if target == STEP else self.turn

    def send(self, message: Message, target: TargetName, wakeup: bool, seq: int = 0) -> _Model:
        if target == STEP:
            return _Model(self.turn, (*self.step, (message, wakeup, seq)))
        return _Model((*self.turn, (message, wakeup, seq)), self.step)

    def withdraw(self, seq: int) -> tuple[TargetName | None, _Model]:
        for target in (TURN, STEP):
            kept = tuple(entry for entry in self.queue(target) if entry[2] != seq)
            if len(kept) != len(self.queue(target)):
                return target, (_Model(self.turn, kept) if target == STEP else _Model(kept, self.step))
        return None, self

    def claim(self, target: TargetName) -> tuple[list[Message], _Model]:
        taken = [m for m, _, _ in self.queue(target)]
        return taken, (_Model(self.turn, ()) if target == STEP else _Model((), self.step))

    def worth_waking(self, target: TargetName) -> bool:
        """Ruling 4, spelled out: an entry that asked for a wake and says something visible
        (not whitespace, not only zero-width or other format characters), or calls a tool."""
        return any(
            wakeup and (_visible(m.content) or bool(m.tool_calls))
            for m, wakeup, _ in self.queue(target)
        )

    def claim_wake_only(self, target: TargetName) -> tuple[list[Message], _Model]:
        return self.claim(target) if self.worth_waking(target) else ([], self)


def _agrees(inbox: Inbox, model: _Model) -> None:
    """Everything the inbox can be asked, asked, and compared with the model's answer."""
    for target in (TURN, STEP):
        queue = model.queue(target)
        assert list(inbox.entries(target)) == [(m, w) for m, w, _ in queue]
        assert inbox.seqs(target) == [seq for _, _, seq in queue]
        assert inbox.count(target) == len(queue)
        assert inbox.has_pending(target) is bool(queue)
        assert inbox.wants_wake(target) is any(w for _, w, _ in queue)
        assert inbox.worth_waking(target) is model.worth_waking(target)
    assert inbox.count() == len(model.turn) + len(model.step)
    assert inbox.has_pending() is bool(model.turn or model.step)
    assert inbox.wants_wake() is any(w for _, w, _ in model.turn + model.step)
    assert inbox.worth_waking() is (model.worth_waking(TURN) or model.worth_waking(STEP))


class InboxMachine(RuleBasedStateMachine):
    """One inbox, one model, and every value the inbox has ever been."""

    def __init__(self) -> None:
        super().__init__()
        self.inbox = Inbox()
        self.model = _Model()
        self.history: list[tuple[Inbox, _Model]] = []
        self.seq = 0  # the last seq a numbered send took: as a log numbers its events

    def _became(self, inbox: Inbox, model: _Model) -> None:
        self.history.append((self.inbox, self.model))
        self.inbox, self.model = inbox, model

    # -- rules ------------------------------------------------------------------------------------

    # (``target`` is a reserved keyword of ``@rule``, hence ``where``.)
    @rule(message=_sendable, where=_targets, wakeup=st.booleans(), numbered=st.booleans())
    def send(self, message: Message | str, where: Target | str, wakeup: bool,
             numbered: bool) -> None:
        seq = 0
        if numbered:
            self.seq += 1
            seq = self.seq
        inbox = self.inbox.send(message, where, wakeup, seq)
        self._became(inbox, self.model.send(_as_message(message), str(where), wakeup, seq))

    @rule(data=st.data())
    def withdraw(self, data: Any) -> None:
        queued = [seq for _, _, seq in self.model.turn + self.model.step if seq]
        seq = data.draw(st.sampled_from(queued) if queued and data.draw(st.booleans())
                        else st.integers(1, self.seq + 2), label="seq")
        where, inbox = self.inbox.withdraw(seq)
        expected, model = self.model.withdraw(seq)
        assert (where, inbox.holds(seq)) == (expected, None)
        if expected is None:
            assert inbox is self.inbox
        self._became(inbox, model)

    @rule(message=_sendable)
    def followup(self, message: Message | str) -> None:
        self._became(
            self.inbox.followup(message), self.model.send(_as_message(message), TURN, True)
        )

    @rule(message=_sendable)
    def steer(self, message: Message | str) -> None:
        self._became(self.inbox.steer(message), self.model.send(_as_message(message), STEP, True))

    @rule(message=_sendable)
    def inject(self, message: Message | str) -> None:
        self._became(self.inbox.inject(message), self.model.send(_as_message(message), STEP, False))

    @rule(where=_targets)
    def claim(self, where: Target | str) -> None:
        claimed, inbox = self.inbox.claim(where)
        expected, model = self.model.claim(str(where))
        assert claimed == expected
        assert list(claimed) == expected
        if not expected:
            assert inbox is self.inbox
        self._became(inbox, model)

    @rule(where=_targets)
    def claim_wake_only(self, where: Target | str) -> None:
        claimed, inbox = self.inbox.claim(where, wake_only=True)
        expected, model = self.model.claim_wake_only(str(where))
        assert list(claimed) == expected
        if not expected:
            assert inbox is self.inbox
        self._became(inbox, model)

    @rule(where=_targets, limit=st.integers(0, 4))
    def claim_the_oldest(self, where: Target | str, limit: int) -> None:
        claimed, inbox = self.inbox.claim(where, limit)
        queue = self.model.queue(str(where))
        taken, kept = queue[:limit], queue[limit:]
        model = _Model(self.model.turn, kept) if str(where) == STEP else _Model(kept, self.model.step)
        assert list(claimed) == [m for m, _, _ in taken]
        self._became(inbox, model)

    @rule(fmt=st.sampled_from(["json", "msgpack"]))
    def round_trip(self, fmt: str) -> None:
        data = getattr(self.inbox, f"to_{fmt}")()
        back = getattr(Inbox, f"from_{fmt}")(data)
        assert back == self.inbox
        assert hash(back) == hash(self.inbox)
        self._became(back, self.model)

    @precondition(lambda self: len(self.history) > 1)
    @rule(data=st.data())
    def go_back_to_an_earlier_value(self, data: Any) -> None:
        # Persistence means any old value is a valid starting point for new work.
        index = data.draw(st.integers(0, len(self.history) - 1), label="history index")
        self._became(*self.history[index])

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        _agrees(self.inbox, self.model)

    @invariant()
    def equal_contents_give_an_equal_value_and_hash(self) -> None:
        rebuilt = Inbox.new()
        for message, wakeup, seq in self.model.turn:
            rebuilt = rebuilt.send(message, TURN, wakeup, seq)
        for message, wakeup, seq in self.model.step:
            rebuilt = rebuilt.send(message, STEP, wakeup, seq)
        assert rebuilt == self.inbox
        assert hash(rebuilt) == hash(self.inbox)

    @invariant()
    def the_value_just_operated_on_is_unchanged(self) -> None:
        if self.history:
            _agrees(*self.history[-1])

    def teardown(self) -> None:
        # Every value ever held, checked once after all the operations (checking them all after
        # every step would make the run quadratic for no extra power: nothing can undo a change).
        for inbox, model in self.history:
            _agrees(inbox, model)


_FAST = settings(
    max_examples=150,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestInboxMachine = InboxMachine.TestCase
TestInboxMachine.settings = _FAST


@pytest.mark.slow
def test_inbox_machine_stress() -> None:
    run_state_machine_as_test(
        InboxMachine,
        settings=settings(_FAST, max_examples=60 * _STRESS, stateful_step_count=60 + 10 * _STRESS),
    )
