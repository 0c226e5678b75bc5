"""AsyncOwner: the owner's asyncio face. What only the face adds is tested here; the wake rules
it shares with the threaded owner run against both, in ``test_owner.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import subprocess
import sys
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from nous_inbox import Message, MessageSent, ToolCall, replay
from nous_inbox.errors import LeaseLostError, RecordTooLargeError, StoreError
from nous_inbox.events import Event, TurnEnded, TurnStarted
from nous_inbox.mailbox import Mailbox
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.runner import Runner
from nous_inbox.store import Store, open_store

ROOT = Path(__file__).resolve().parent.parent
WAIT = 30  # seconds; a generous bound for a wait that should end at once, never a sync sleep


async def echo(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
    return Message.assistant(f"heard: {transcript[-1].content}")


def test_a_steer_is_stored_then_answered_on_the_event_loop() -> None:
    async def main() -> None:
        store = open_store("memory:")
        async with AsyncOwner(store, "s", Runner(echo)) as owner:
            sent = await owner.steer("hello")
            assert isinstance(sent, MessageSent) and sent.seq == 1
            assert await owner.wait_idle(WAIT)
            assert [m.content for m in owner.transcript] == ["hello", "heard: hello"]
            assert owner.session == replay(list(store.read(owner.stream)))

    asyncio.run(main())


def test_an_injection_wakes_nothing_and_a_followup_opens_a_turn() -> None:
    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", Runner(echo)) as owner:
            await owner.inject("fyi")
            assert await owner.wait_idle(WAIT)
            assert owner.session.turn == 0
            await owner.followup("go").stored()
            assert await owner.wait_idle(WAIT)
            assert [m.content for m in owner.transcript] == ["go", "fyi", "heard: fyi"]

    asyncio.run(main())


def test_events_from_a_position_are_the_stored_ones_then_the_live_ones() -> None:
    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", Runner(echo)) as owner:
            await owner.steer("one")
            assert await owner.wait_idle(WAIT)
            stored = owner.session.version
            reader = owner.events(after=2)
            seen: list[Event] = []
            async for event in reader:  # the stored tail first
                seen.append(event)
                if event.seq == stored:
                    break
            assert [e.seq for e in seen] == list(range(3, stored + 1))
            resumed = owner.events(after=stored)  # a client reconnecting with its last seq
            first = asyncio.ensure_future(anext(resumed))
            await owner.steer("two")
            event = await asyncio.wait_for(first, WAIT)
            assert event.seq == stored + 1 and isinstance(event, MessageSent)
            async for event in resumed:  # live, in order, until that run ends
                if isinstance(event, TurnEnded):
                    break
            await resumed.aclose()

    asyncio.run(main())


def test_events_end_when_the_owner_closes() -> None:
    async def main() -> list[int]:
        owner = AsyncOwner(open_store("memory:"), "s", Runner(echo))
        async with owner:
            await owner.inject("x")
            reader = owner.events()
            first = await anext(reader)
        return [first.seq] + [event.seq async for event in reader]

    assert asyncio.run(main()) == [1]


def test_bad_input_is_refused_before_anything_is_written() -> None:
    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", Runner(echo)) as owner:
            with pytest.raises(TypeError, match="wakeup must be a bool"):
                await owner.send("x", "next_step", "yes")  # type: ignore[arg-type]
            with pytest.raises(ValueError):
                await owner.send("x", "somewhere", True)
            assert owner.session.version == 0

    asyncio.run(main())


def test_a_refused_send_raises_where_it_is_awaited_so_gather_returns_it_beside_the_others(
) -> None:
    async def main() -> list[Any]:
        store = open_store("memory:")
        too_big = "x" * (store.max_record_size + 1)  # type: ignore[attr-defined]
        async with AsyncOwner(store, "s", Runner(echo)) as owner:
            return await asyncio.gather(owner.inject("fyi"), owner.inject(too_big),
                                        return_exceptions=True)

    sent, refused = asyncio.run(main())
    assert isinstance(sent, MessageSent) and sent.message.content == "fyi"
    assert isinstance(refused, RecordTooLargeError)


def test_no_send_verb_raises_at_the_call_each_raises_when_awaited() -> None:
    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", Runner(echo)) as owner:
            bad = {  # made first, all of them: none raises here
                "bad target": owner.send("x", "somewhere", True),
                "bad wakeup": owner.send("x", "next_step", "yes"),  # type: ignore[arg-type]
                "bad message": owner.steer(42),  # type: ignore[arg-type]
                "bad injection": owner.inject(object()),  # type: ignore[arg-type]
                "bad followup": owner.followup(7),  # type: ignore[arg-type]
                "options no runner takes": owner.prompt("go", deps="ada"),
                "blank prompt": owner.prompt("   "),
                "blank followup": owner.followup("\n"),
            }
            for what, awaitable in bad.items():
                with pytest.raises((TypeError, ValueError)):
                    await awaitable
                    pytest.fail(f"{what}: accepted")
            assert owner.session.version == 0  # nothing was written
        late = [owner.steer("a"), owner.inject("b"), owner.send("c", "next_turn", True),
                owner.followup("d"), owner.prompt("e")]
        for awaitable in late:
            with pytest.raises(RuntimeError, match="closed"):
                await awaitable

    asyncio.run(main())


def test_a_blank_prompt_is_answered_at_once_by_its_refusal_never_by_a_wait() -> None:
    async def main() -> None:
        async with AsyncOwner(open_store("memory:"), "s", Runner(echo)) as owner:
            handle = owner.prompt("  \t ")
            with pytest.raises(ValueError, match="prompt: the message is blank"):
                await asyncio.wait_for(handle, WAIT)  # at once: never a wait for a turn
            with pytest.raises(ValueError, match="blank"):
                await handle.stored()
            with pytest.raises(RuntimeError, match="refused"):
                handle.sent  # noqa: B018

    asyncio.run(main())


def test_a_result_that_times_out_says_which_send_and_that_its_turn_goes_on() -> None:
    async def main() -> str:
        release = asyncio.Event()

        async def slow(transcript: Sequence[Message], tools: Any) -> Message:
            await release.wait()
            return Message.assistant("late")

        async with AsyncOwner(open_store("memory:"), "s", Runner(slow)) as owner:
            handle = owner.prompt("go")
            with pytest.raises(TimeoutError) as timed_out:
                await handle.result(timeout=0)
            release.set()
            assert (await handle.result(timeout=WAIT)).text == "late"  # it went on
            return str(timed_out.value)

    assert asyncio.run(main()) == ("the turn of the send at seq 1 of session 's' did not end "
                                   "within 0 s (the turn goes on: wait again, or cancel() it)")


def test_a_runner_without_arun_turn_is_refused() -> None:
    with pytest.raises(TypeError, match="arun_turn"):
        AsyncOwner(open_store("memory:"), "s", object())  # type: ignore[arg-type]


def test_using_it_unopened_says_how_to_open_it() -> None:
    owner = AsyncOwner(open_store("memory:"), "s", Runner(echo))
    with pytest.raises(RuntimeError, match="async with"):
        asyncio.run(owner.steer("x"))


class OffTheLoop:
    """A store that says its calls block, and notes the thread of every call, to prove none ran
    on the event loop."""

    blocking = True

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.threads: set[int] = set()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def noted(*args: Any, **kwargs: Any) -> Any:
            self.threads.add(threading.get_ident())
            return attr(*args, **kwargs)

        return noted


def test_store_io_never_runs_on_the_event_loop() -> None:
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.models.function import FunctionModel

    from nous_inbox.adapters.pydantic_ai import AgentRunner

    def model(messages: Any, info: Any) -> ModelResponse:
        if len(messages) == 1:
            return ModelResponse(parts=[ToolCallPart("work", {}, "c1")])
        return ModelResponse(parts=[TextPart("done")])

    agent: Agent[None, str] = Agent(FunctionModel(model))

    @agent.tool_plain
    def work() -> str:
        """Work."""
        return "ok"

    store = OffTheLoop(open_store("memory:"))

    async def main() -> int:
        async with AsyncOwner(store, "s", AgentRunner(agent)) as owner:  # type: ignore[arg-type]
            await owner.prompt("go").stored()
            assert await owner.wait_idle(WAIT)
            [e async for e in _until(owner.events(), owner.session.version)]
            assert owner.transcript[-1].content == "done"
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert store.threads and loop_thread not in store.threads


async def _until(reader: Any, seq: int) -> Any:
    async for event in reader:
        yield event
        if event.seq >= seq:
            return


def test_an_idle_async_owner_wakes_for_a_steer_another_process_appended(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"

    async def main() -> None:
        async with AsyncOwner(open_store(url), "s", Runner(echo), poll_interval=0.01) as owner:
            reader = owner.events()
            await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "nous_inbox", "steer", "--create", "--store", url, "s",
                 "wake up"],  # the owner waits on a session with no events yet
                check=True, capture_output=True, cwd=ROOT,
            )
            async for event in reader:
                if isinstance(event, TurnEnded):
                    break
            assert await owner.wait_idle(WAIT)
            assert [m.content for m in owner.transcript] == ["wake up", "heard: wake up"]

    asyncio.run(main())


def test_it_resumes_from_the_log_and_answers_what_was_left_waiting(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    store = open_store(url)
    store.append("s", [MessageSent(target="next_step", wakeup=True, message=Message.user("left"))])

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo)) as owner:
            assert await owner.wait_idle(WAIT)
            assert [m.content for m in owner.transcript] == ["left", "heard: left"]

    asyncio.run(main())
    store.close()


def test_a_slow_tool_leaves_the_loop_free_for_sends() -> None:
    release = asyncio.Event()

    async def model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        if transcript[-1].role == "user" and transcript[-1].content == "go":
            return Message.assistant(tool_calls=[ToolCall("c1", "wait", {})])
        return Message.assistant(f"saw {transcript[-1].content}")

    async def wait() -> str:
        await release.wait()
        return "released"

    async def main() -> list[str]:
        async with AsyncOwner(open_store("memory:"), "s", Runner(model, [wait])) as owner:
            started = owner.events()
            await owner.prompt("go").stored()
            async for event in started:
                if isinstance(event, TurnStarted):
                    break
            await owner.steer("meanwhile")  # answered while the tool still waits
            release.set()
            assert await owner.wait_idle(WAIT)
            return [m.content for m in owner.transcript]

    assert asyncio.run(main())[-2:] == ["meanwhile", "saw meanwhile"]


class Gated:
    """A store whose calls block (``blocking = True``) and whose appends can be held at a gate:
    ``hold()`` makes the next append wait, ``entered`` says one is waiting, ``release()`` lets
    it through."""

    blocking = True

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self._gate = threading.Event()
        self._gate.set()
        self.entered = threading.Event()

    def hold(self) -> None:
        self.entered.clear()
        self._gate.clear()

    def release(self) -> None:
        self._gate.set()

    def append(self, *args: Any, **kwargs: Any) -> Any:
        if not self._gate.is_set():
            self.entered.set()
            self._gate.wait()
        return self._inner.append(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_send_held_in_the_store_leaves_the_loop_running_other_tasks() -> None:
    store = Gated(open_store("memory:"))

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo)) as owner:  # type: ignore[arg-type]
            store.hold()
            sending = asyncio.ensure_future(owner.inject("held"))
            await asyncio.to_thread(store.entered.wait)  # the append is inside the store now
            other = asyncio.ensure_future(asyncio.sleep(0, result="ran"))
            assert await other == "ran"  # the loop runs other tasks meanwhile
            assert not sending.done() and owner.session.version == 0
            store.release()
            assert (await sending).seq == 1

    asyncio.run(main())


def test_a_runs_record_held_in_the_store_leaves_the_loop_running_other_tasks() -> None:
    store = Gated(open_store("memory:"))
    held: list[str] = []

    async def model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        store.hold()  # the run's next record (its reply) waits at the gate
        return Message.assistant("answer")

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(model)) as owner:  # type: ignore[arg-type]
            await owner.steer("go")
            await asyncio.to_thread(store.entered.wait)  # the run is recording, in the store
            held.append(await asyncio.ensure_future(asyncio.sleep(0, result="ran")))
            assert owner.running
            store.release()
            assert await owner.wait_idle(WAIT)
            assert owner.transcript[-1].content == "answer"

    asyncio.run(main())
    assert held == ["ran"]


# -- events(after=): resuming a stream while others append -------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.parametrize("after", [0, 3, 7])
def test_a_reader_resumed_mid_stream_sees_every_later_event_once_in_order(
    tmp_path: Path, kind: str, after: int
) -> None:
    url = "memory:" if kind == "memory" else f"sqlite:{tmp_path / 'inbox.sqlite'}"
    store = open_store(url)

    def other_writer() -> None:  # another writer of the stream, appending straight to the store
        for i in range(10):
            store.append("s", [MessageSent(target="next_step", wakeup=False,
                                           message=Message.user(f"other {i}"))])

    async def main() -> list[int]:
        async with AsyncOwner(store, "s", Runner(echo), poll_interval=0.01) as owner:
            for i in range(8):
                await owner.inject(f"before {i}")
            reader = owner.events(after=after)
            first = asyncio.ensure_future(anext(reader))  # the reader starts amid the sends

            async def ours() -> None:
                for i in range(20):
                    await owner.inject(f"ours {i}")

            await asyncio.gather(ours(), asyncio.to_thread(other_writer), first)
            last = store.version("s")
            seqs = [first.result().seq]
            while seqs[-1] < last:
                seqs.append((await asyncio.wait_for(anext(reader), WAIT)).seq)
            await reader.aclose()
            return seqs

    assert asyncio.run(main()) == list(range(after + 1, 8 + 20 + 10 + 1))
    store.close()


def test_a_reader_of_a_closed_owner_is_refused() -> None:
    async def main() -> None:
        owner = AsyncOwner(open_store("memory:"), "s", Runner(echo))
        async with owner:
            pass
        with pytest.raises(RuntimeError, match="closed"):
            await anext(owner.events())

    asyncio.run(main())


# -- cancel, close ---------------------------------------------------------------------------------


def test_a_cancel_right_after_the_waking_send_means_no_turn_starts() -> None:
    store = open_store("memory:")

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo)) as owner:
            await owner.steer("go")
            assert owner.running and owner.cancel()
            assert await owner.wait_idle(WAIT)
            assert [type(e).__name__ for e in store.read("s")] == ["MessageSent"]
            assert owner.inbox.count("next_step") == 1  # still queued, waking nothing
            assert not owner.cancel()  # nothing to cancel now

    asyncio.run(main())


def test_closing_ends_a_run_stuck_in_its_model_and_gives_the_stream_up() -> None:
    store = open_store("memory:")
    asked = asyncio.Event()

    async def stuck(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        asked.set()
        await asyncio.Event().wait()  # never answers
        raise AssertionError("unreachable")

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(stuck)) as owner:
            await owner.steer("go")
            await asyncio.wait_for(asked.wait(), WAIT)
        ends = [e for e in store.read("s") if isinstance(e, TurnEnded)]
        assert [e.reason for e in ends] == ["cancelled"]
        async with AsyncOwner(store, "s", Runner(echo), start=False) as again:  # lease released
            assert not again.session.running

    asyncio.run(main())


# -- a lost lease ------------------------------------------------------------------------------


class TakenOver:
    """A store whose lease another owner takes over at ``take()``: from then on every append is
    fenced (``LeaseLostError``, nothing written), as PostgreSQL does."""

    def __init__(self, inner: Store, blocking: bool) -> None:
        self._inner = inner
        self.blocking = blocking
        self.taken = False

    def take(self) -> None:
        self.taken = True

    def append(self, *args: Any, **kwargs: Any) -> Any:
        if self.taken:
            raise LeaseLostError("lease of stream 's' was taken over; nothing was written",
                                 stream="s", epoch=1)
        return self._inner.append(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@pytest.mark.parametrize("blocking", [False, True])
def test_an_owner_whose_lease_was_taken_over_stops_and_says_so(blocking: bool) -> None:
    store = TakenOver(open_store("memory:"), blocking)

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo)) as owner:  # type: ignore[arg-type]
            await owner.inject("before")
            store.take()
            with pytest.raises(LeaseLostError):
                await owner.steer("after")
            assert owner.lost is not None and owner.closed
            with pytest.raises(LeaseLostError):  # every later send, and every wait
                await owner.inject("again")
            with pytest.raises(LeaseLostError):
                await owner.wait_idle(WAIT)
            assert not owner.running and owner.session.version == 1

    asyncio.run(main())


def test_a_run_whose_lease_is_taken_over_stops_without_recording_more() -> None:
    store = TakenOver(open_store("memory:"), blocking=True)

    async def model(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        store.take()  # taken over while the model thinks: its reply cannot be recorded
        return Message.assistant("too late")

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(model)) as owner:  # type: ignore[arg-type]
            await owner.steer("go")
            with pytest.raises(LeaseLostError):
                await owner.wait_idle(WAIT)
            assert isinstance(owner.lost, LeaseLostError) and not owner.running
            kinds = [type(e).__name__ for e in store.read("s")]
            assert "ModelReplied" not in kinds and kinds[-1] == "ModelRequested"

    asyncio.run(main())


class RenewalLost:
    """A store whose lease can be found taken over (``lease.lost = True``), as the PostgreSQL
    lease's renewal finds it, with no append needed to notice."""

    blocking = True

    def __init__(self, inner: Store) -> None:
        self._inner = inner
        self.lease: Any = None

    def own(self, stream: str) -> Any:
        inner = self._inner.own(stream)

        class Lease:
            lost = False
            epoch = 7

            def release(self) -> None:
                inner.release()

        self.lease = Lease()
        return self.lease

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_the_watcher_notices_a_lease_taken_over_and_the_run_stops() -> None:
    store = RenewalLost(open_store("memory:"))
    asked = asyncio.Event()

    async def stuck(transcript: Sequence[Message], tools: Sequence[Any]) -> Message:
        asked.set()
        await asyncio.Event().wait()  # still thinking when the lease is lost
        raise AssertionError("unreachable")

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(stuck), poll_interval=0.01) as owner:  # type: ignore[arg-type]
            await owner.steer("go")
            await asyncio.wait_for(asked.wait(), WAIT)
            store.lease.lost = True
            with pytest.raises(LeaseLostError, match="taken over") as raised:
                await owner.wait_idle(WAIT)  # returns at once when the watcher notices
            assert raised.value.epoch == 7 and owner.lost is not None
            with pytest.raises(LeaseLostError):
                await owner.steer("more")

    asyncio.run(main())


# -- the worker's group commit ------------------------------------------------------------------


class Counting:
    """A store whose calls block, counting appends; ``refuse`` makes each append raise the given
    error before writing, ``lose_answer`` makes the next multi-event append commit and then raise
    ``StoreError`` (PostgreSQL losing the answer to its COMMIT); with a ``gate``, the next append
    says it ``entered`` and waits until the gate is set, as one to a slow disk would."""

    blocking = True

    def __init__(self) -> None:
        self.inner = open_store("memory:")
        self.appends = 0
        self.refuse: Exception | None = None
        self.lose_answer = False
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def append(self, stream: str, events: Sequence[Any], expected_version: Any = None) -> Any:
        self.appends += 1
        gate, self.gate = self.gate, None
        if gate is not None:
            self.entered.set()
            assert gate.wait(WAIT)
        if self.refuse is not None:
            raise self.refuse
        stored = self.inner.append(stream, events, expected_version)
        if self.lose_answer and len(events) > 1:
            self.lose_answer = False
            raise StoreError("lost the connection and could not get it back within 10s")
        return stored

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def _held(owner: AsyncOwner, store: Counting) -> tuple[threading.Event, asyncio.Future[Any]]:
    """Keep the owner's store worker busy until the returned gate is set: a send of "first"
    whose append waits at the store's gate; sends made meanwhile queue for the next batch."""
    gate = store.gate = threading.Event()
    busy = asyncio.ensure_future(owner.inject("first"))
    assert await asyncio.to_thread(store.entered.wait, WAIT)
    return gate, busy


def sent_texts(store: Any) -> list[str]:
    return [e.message.content for e in store.read("s") if isinstance(e, MessageSent)]


def test_a_send_cancelled_before_the_worker_took_it_is_not_written() -> None:
    store = Counting()

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo), watch=False, start=False) as owner:  # type: ignore[arg-type]
            gate, busy = await _held(owner, store)
            with pytest.raises(TimeoutError):  # the caller gives up: the send is taken back
                await asyncio.wait_for(owner.inject("once"), 0.05)
            gate.set()
            await busy
            assert (await owner.inject("after")).seq == 2
            assert sent_texts(store) == ["first", "after"]  # "once" was not written

    asyncio.run(main())


def test_a_send_the_store_refuses_alone_is_tried_once() -> None:
    store = Counting()
    store.refuse = ValueError("refused: the record is too large")

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo), watch=False, start=False) as owner:  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="refused"):
                await owner.inject("x")
            assert store.appends == 1

    asyncio.run(main())


def test_a_send_the_store_refuses_in_a_shared_batch_fails_only_its_own_sender() -> None:
    store = Counting()

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo), watch=False, start=False) as owner:  # type: ignore[arg-type]
            limit = store.max_record_size
            gate, busy = await _held(owner, store)
            sends = [asyncio.ensure_future(owner.inject(text))
                     for text in ("a", "x" * (limit + 1), "c")]
            await asyncio.sleep(0)  # all three queued for one batch
            gate.set()
            await busy
            outcomes = await asyncio.gather(*sends, return_exceptions=True)
            assert isinstance(outcomes[1], ValueError) and "limit" in str(outcomes[1])
            assert [o.message.content for o in (outcomes[0], outcomes[2])] == ["a", "c"]  # type: ignore[union-attr]
            assert sent_texts(store) == ["first", "a", "c"]

    asyncio.run(main())


def test_a_batch_whose_outcome_is_unknown_is_not_written_again_and_every_sender_hears_why() -> None:
    store = Counting()

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo), watch=False, start=False) as owner:  # type: ignore[arg-type]
            gate, busy = await _held(owner, store)
            store.lose_answer = True
            sends = [asyncio.ensure_future(owner.inject(text)) for text in "abc"]
            await asyncio.sleep(0)
            gate.set()
            await busy
            outcomes = await asyncio.gather(*sends, return_exceptions=True)
            assert all(isinstance(o, StoreError) for o in outcomes)  # nothing acknowledged
            assert store.appends == 2  # "first", then the shared batch, once
            assert sent_texts(store.inner) == ["first", "a", "b", "c"]  # once each

    asyncio.run(main())


# -- cleanup a cancel cannot skip ------------------------------------------------------------------


class SlowToOpen:
    """A store whose calls block, whose ``own`` waits at a gate, and whose ``subscribe`` waits at
    another; it says when the lease is released and when the subscription is dropped."""

    blocking = True

    def __init__(self) -> None:
        self._inner = open_store("memory:")
        self.own_gate = threading.Event()
        self.subscribe_gate = threading.Event()
        self.subscribing = threading.Event()
        self.released = threading.Event()
        self.unsubscribed = threading.Event()

    def own(self, stream: str) -> Any:
        self.own_gate.wait(WAIT)
        inner = self._inner.own(stream)
        released = self.released

        class Lease:
            def release(self) -> None:
                inner.release()
                released.set()

        return Lease()

    def subscribe(self, stream: str, callback: Any) -> Any:
        self.subscribing.set()
        self.subscribe_gate.wait(WAIT)
        return self.unsubscribed.set

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_an_open_cancelled_while_it_takes_the_lease_gives_the_lease_back() -> None:
    store = SlowToOpen()

    async def main() -> None:
        owner = AsyncOwner(store, "s", Runner(echo), watch=False)  # type: ignore[arg-type]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(owner.__aenter__(), 0.05)
        store.own_gate.set()  # the lease is taken after the caller gave up ...
        assert await asyncio.to_thread(store.released.wait, WAIT)  # ... and given back
        async with AsyncOwner(store, "s", Runner(echo), watch=False) as again:  # type: ignore[arg-type]
            assert not again.closed

    asyncio.run(main())


def test_closing_while_the_watcher_subscribes_drops_the_subscription() -> None:
    store = SlowToOpen()
    store.own_gate.set()

    async def main() -> None:
        owner = AsyncOwner(store, "s", Runner(echo))  # type: ignore[arg-type]
        await owner.__aenter__()
        assert await asyncio.to_thread(store.subscribing.wait, WAIT)
        closing = asyncio.ensure_future(owner.aclose())  # cancels the watcher mid-subscribe
        await asyncio.sleep(0)
        store.subscribe_gate.set()  # the subscription is made after the watcher was cancelled
        await asyncio.wait_for(closing, WAIT)
        assert store.unsubscribed.is_set()  # ... and dropped by the close

    asyncio.run(main())


def test_a_reader_of_events_ends_when_the_lease_is_lost() -> None:
    store = TakenOver(open_store("memory:"), blocking=False)

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo)) as owner:  # type: ignore[arg-type]
            await owner.inject("before")
            reader = owner.events()
            assert (await anext(reader)).seq == 1  # reading live from here on

            async def rest() -> list[int]:
                return [event.seq async for event in reader]

            store.take()
            with pytest.raises(LeaseLostError):
                await owner.inject("after")
            assert await asyncio.wait_for(rest(), WAIT) == []

    asyncio.run(main())


def test_a_cancelled_close_still_gives_the_stream_up_once_the_run_ends(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"
    asked = asyncio.Event()

    class Stubborn:
        """A runner that ignores its cancel event and its task's cancel for half a second."""

        async def arun_turn(self, port: Any, *, reason: str = "wake",
                            cancel: asyncio.Event | None = None) -> Any:
            asked.set()
            end = asyncio.get_running_loop().time() + 0.5
            while (left := end - asyncio.get_running_loop().time()) > 0:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(left)
            async for event in Runner(echo).arun_turn(port, reason=reason, cancel=cancel):
                yield event

    async def main() -> None:
        store = open_store(url)
        owner = await AsyncOwner(store, "s", Stubborn()).__aenter__()
        io_threads = {t for t in threading.enumerate() if t.name.startswith("nous-inbox io")}
        await owner.steer("go")
        await asyncio.wait_for(asked.wait(), WAIT)
        closing = asyncio.ensure_future(owner.aclose(timeout=WAIT))
        await asyncio.sleep(0)  # the close is under way (its teardown is a task of its own)
        closing.cancel()  # the host gives up waiting, e.g. a second Ctrl-C
        with pytest.raises(asyncio.CancelledError):
            await closing
        await asyncio.wait_for(owner.aclose(), WAIT)  # a retry waits for the same teardown
        async with AsyncOwner(open_store(url), "s", Runner(echo), start=False) as again:
            assert not again.session.running  # the lease was given back
        for thread in io_threads:
            thread.join(WAIT)
            assert not thread.is_alive()

    asyncio.run(main())


class TakenThenHeld(Counting):
    """A ``Counting`` store whose append of a send signals ``taken`` and then waits at ``gate``:
    a send the worker has taken up, its outcome not yet known."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop, self.taken, self.gate = loop, asyncio.Event(), threading.Event()

    def append(self, stream: str, events: Sequence[Any], expected_version: Any = None) -> Any:
        if any(isinstance(e, MessageSent) for e in events) and not self.gate.is_set():
            self.loop.call_soon_threadsafe(self.taken.set)
            self.gate.wait(WAIT)
        return super().append(stream, events, expected_version)


def turn_reasons(store: Any) -> list[str]:
    return [e.reason for e in store.read("s") if isinstance(e, TurnStarted)]


def test_a_prompt_cancelled_after_the_worker_took_it_still_opens_its_turn_as_a_prompt() -> None:
    async def main() -> None:
        store = TakenThenHeld(asyncio.get_running_loop())
        async with AsyncOwner(store, "s", Runner(echo), watch=False) as owner:  # type: ignore[arg-type]
            reader = owner.events()  # the run the prompt wakes is seen through the log
            task = asyncio.ensure_future(owner.prompt("hello"))
            await asyncio.wait_for(store.taken.wait(), WAIT)
            task.cancel()  # too late to take back: the prompt is being stored
            with pytest.raises(asyncio.CancelledError):
                await task
            store.gate.set()

            async def turn_ends() -> None:
                async for event in reader:
                    if isinstance(event, TurnEnded):
                        return

            await asyncio.wait_for(turn_ends(), WAIT)
            await asyncio.wait_for(owner.wait_idle(), WAIT)
            assert sent_texts(store) == ["hello"]
            assert turn_reasons(store) == ["prompt"]

    asyncio.run(main())


def test_a_prompt_the_store_refused_leaves_the_next_turn_a_wake() -> None:
    store = Counting()

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo), watch=False) as owner:  # type: ignore[arg-type]
            store.refuse = ValueError("refused: the record is too large")
            with pytest.raises(ValueError, match="refused"):
                await owner.prompt("hello").stored()
            store.refuse = None
            await owner.followup("later").stored()
            await asyncio.wait_for(owner.wait_idle(), WAIT)
            assert turn_reasons(store) == ["wake"]

    asyncio.run(main())


def test_each_sender_of_a_failed_batch_hears_its_own_error_caused_by_the_shared_one() -> None:
    store = Counting()

    async def main() -> None:
        async with AsyncOwner(store, "s", Runner(echo), watch=False, start=False) as owner:  # type: ignore[arg-type]
            gate, busy = await _held(owner, store)
            store.lose_answer = True
            sends = [asyncio.ensure_future(owner.inject(text)) for text in "abc"]
            await asyncio.sleep(0)
            gate.set()
            await busy
            outcomes = await asyncio.gather(*sends, return_exceptions=True)
            assert len({id(o) for o in outcomes}) == 3  # notes one handler adds stay its own
            causes = {id(o.__cause__) for o in outcomes}  # type: ignore[union-attr]
            assert len(causes) == 1 and all(isinstance(o.__cause__, StoreError) for o in outcomes)  # type: ignore[union-attr]

    asyncio.run(main())


class ClosesItsOwner:
    """A runner whose turn closes its own owner (as a tool ending the session would), then ends."""

    def __init__(self) -> None:
        self.owner: AsyncOwner | None = None
        self.host_closing = asyncio.Event()  # set: wait for it before closing
        self.wait_for_host = False
        self.closed_at_once: bool | None = None

    async def arun_turn(self, port: Any, *, reason: str = "wake",
                        cancel: asyncio.Event | None = None) -> Any:
        assert self.owner is not None
        if self.wait_for_host:
            await asyncio.wait_for(self.host_closing.wait(), WAIT)
        before = asyncio.get_running_loop().time()
        await self.owner.aclose(timeout=WAIT)  # in this task: a wait_for would start another
        self.closed_at_once = asyncio.get_running_loop().time() - before < WAIT / 2
        async for event in Runner(echo).arun_turn(port, reason=reason, cancel=cancel):
            yield event


@pytest.mark.parametrize("blocking", [False, True])
def test_a_run_that_closes_its_own_owner_gives_the_stream_up_when_it_ends(
    tmp_path: Path, blocking: bool
) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"

    async def main() -> None:
        runner = ClosesItsOwner()
        owner = runner.owner = await AsyncOwner(open_store(url), "s", runner,
                                                offload=blocking).__aenter__()
        io_threads = {t for t in threading.enumerate() if t.name.startswith("nous-inbox io")}
        await owner.steer("go")
        await asyncio.wait_for(owner.wait_idle(), WAIT)
        assert owner.closed and runner.closed_at_once
        for _ in range(3):
            await asyncio.sleep(0)  # the run's task ends just after wait_idle returns
        for thread in io_threads:  # the worker stops once it has given the lease back
            await asyncio.to_thread(thread.join, WAIT)
            assert not thread.is_alive()
        async with AsyncOwner(open_store(url), "s", Runner(echo), start=False) as again:
            assert not again.session.running  # the lease was given back

    asyncio.run(main())


def test_a_run_closing_its_owner_while_the_host_closes_it_returns_at_once(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'inbox.sqlite'}"

    async def main() -> None:
        runner = ClosesItsOwner()
        runner.wait_for_host = True
        owner = runner.owner = await AsyncOwner(open_store(url), "s", runner).__aenter__()
        await owner.steer("go")
        closing = asyncio.ensure_future(owner.aclose(timeout=WAIT))
        await asyncio.sleep(0)  # the host's teardown is under way
        runner.host_closing.set()
        await asyncio.wait_for(closing, WAIT)
        assert runner.closed_at_once  # not stalled until the host's timeout
        async with AsyncOwner(open_store(url), "s", Runner(echo), start=False) as again:
            assert not again.session.running  # the lease was given back

    asyncio.run(main())


def _never_awaited(caught: Sequence[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if "never awaited" in str(w.message)]


def test_a_listeners_send_on_an_idle_owner_need_not_be_awaited() -> None:
    # A listener is told on the loop and cannot await: its send, queued for the store worker
    # (offload), is stored all the same, and the coroutine it was handed is no warning when dropped.
    async def main() -> list[str]:
        async with AsyncOwner(open_store("memory:"), "s", Runner(echo), offload=True) as owner:
            def relay(event: Event) -> None:
                if isinstance(event, MessageSent) and event.message.content == "fyi":
                    owner.inject("noted by a listener")  # not awaited, on purpose

            owner.listen(relay)
            await owner.inject("fyi")
            heard = [e.message.content async for e in _until(owner.events(), 2)
                     if isinstance(e, MessageSent)]
            gc.collect()
            return heard

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert asyncio.run(main()) == ["fyi", "noted by a listener"]
        gc.collect()
    assert _never_awaited(caught) == []


def test_a_mailbox_lets_go_of_an_async_owner_that_closed_as_of_a_threaded_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The closed owner's send refuses (when awaited: the mailbox awaits nothing, so it hears
    # the refusal from what the send returned) and the mailbox detaches it, its mail kept.
    async def main() -> None:
        with Mailbox(debounce=0) as box:
            async with AsyncOwner(open_store("memory:"), "s", Runner(echo)) as owner:
                box.attach("writer", owner)
            box.agent("lead").send("writer", "draft ready")
            async with AsyncOwner(open_store("memory:"), "s", Runner(echo)) as again:
                box.attach("writer", again)  # the closed owner's desk was let go of

    asyncio.run(main())
    assert "the owner of 'writer' is closed: detached it" in caplog.text
    assert "nobody awaited" not in caplog.text


@pytest.mark.parametrize("sender", ["loop", "thread"])
def test_an_idle_agents_mailbox_notice_reaches_its_async_owner_without_a_warning(
    sender: str,
) -> None:
    # The mailbox hands an idle agent its notice with a plain send it does not await, from
    # whatever thread sent the mail: on the loop it is queued, off it stored right then.
    async def main() -> list[str]:
        with Mailbox(debounce=0) as box:
            async with AsyncOwner(open_store("memory:"), "s", Runner(echo), offload=True) as owner:
                box.attach("writer", owner)
                lead = box.agent("lead")
                reader = owner.events()
                if sender == "loop":
                    lead.send("writer", "draft ready")
                else:
                    await asyncio.to_thread(lead.send, "writer", "draft ready")
                async for event in reader:
                    if isinstance(event, TurnEnded):
                        break
                await reader.aclose()
                gc.collect()
                return [m.content.splitlines()[0] for m in owner.transcript]

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        heard = asyncio.run(main())
        gc.collect()
    assert heard[0].startswith("1 new message in your mailbox") and len(heard) == 2
    assert _never_awaited(caught) == []
