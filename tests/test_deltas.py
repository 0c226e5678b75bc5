"""What they say, as they say it: a model's text reaches live readers while the model produces
it, in order with the logged events and before the reply is logged; it is never logged itself,
a reader that did not ask sees nothing new, and a reader that does not read never slows the run.

Real pydantic-ai agents with a ``FunctionModel`` that streams (no network), under both owners
and the web face's event stream.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage
from pydantic_ai.models.function import AgentInfo, FunctionModel

from nous_inbox.adapters.pydantic_ai import AgentRunner
from nous_inbox.events import Event, ModelReplied, ModelRequested, TurnEnded, Warned
from nous_inbox.owner import AsyncOwner, Owner
from nous_inbox.owner.event_readers import Feed
from nous_inbox.runner import LocalSession, Runner
from nous_inbox.runner.deltas import Deltas, TextDelta, deltas_of
from nous_inbox.store import open_store
from tests.helpers import WAIT

Stream = Callable[[list[ModelMessage], AgentInfo], AsyncIterator[str]]


def words(*pieces: str) -> Stream:
    """A stream function that says ``pieces``, one at a time."""

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        for piece in pieces:
            yield piece

    return stream


def streaming_runner(stream: Stream) -> AgentRunner:
    return AgentRunner(Agent(FunctionModel(stream_function=stream)))


def text_of(items: list[Any]) -> str:
    return "".join(item.text for item in items if type(item) is TextDelta)


async def read_turn(reader: AsyncIterator[Any], seen: list[Any]) -> None:
    async for item in reader:
        seen.append(item)
        if type(item) is TurnEnded:
            return


# -- an AsyncOwner's events() reader -----------------------------------------------------------


def test_a_reader_that_asks_gets_each_piece_while_the_model_produces_the_next() -> None:
    asyncio.run(_each_piece_while_the_model_produces_the_next())


async def _each_piece_while_the_model_produces_the_next() -> None:
    first_read = asyncio.Event()

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> AsyncIterator[str]:
        yield "Hel"
        await asyncio.wait_for(first_read.wait(), WAIT)  # the reader has the first piece already
        yield "lo"

    async with AsyncOwner(open_store("memory:"), "s", streaming_runner(stream)) as owner:
        seen: list[Any] = []

        async def read() -> None:
            async for item in owner.events(deltas=True):
                seen.append(item)
                if type(item) is TextDelta:
                    first_read.set()
                if type(item) is TurnEnded:
                    return

        reading = asyncio.ensure_future(read())
        await asyncio.sleep(0)  # the reader starts listening
        assert (await owner.prompt("hi")).text == "Hello"
        await asyncio.wait_for(reading, WAIT)

    kinds = [type(item) for item in seen]
    deltas = [item for item in seen if type(item) is TextDelta]
    assert [d.text for d in deltas] == ["Hel", "lo"]
    # in order with the events: after the request, before the reply that holds them
    assert kinds.index(ModelRequested) < kinds.index(TextDelta)
    assert max(i for i, k in enumerate(kinds) if k is TextDelta) < kinds.index(ModelReplied)
    replied = next(item for item in seen if type(item) is ModelReplied)
    assert all((d.turn, d.step) == (replied.turn, replied.step) for d in deltas)


def test_deltas_are_never_logged_and_a_reader_that_did_not_ask_sees_only_events() -> None:
    asyncio.run(_never_logged())


async def _never_logged() -> None:
    store = open_store("memory:")
    async with AsyncOwner(store, "s", streaming_runner(words("a ", "b ", "c"))) as owner:
        plain: list[Any] = []
        asking: list[Any] = []
        readers = [asyncio.ensure_future(read_turn(owner.events(), plain)),
                   asyncio.ensure_future(read_turn(owner.events(deltas=True), asking))]
        await asyncio.sleep(0)
        await owner.prompt("hi")
        await asyncio.wait_for(asyncio.gather(*readers), WAIT)
    logged = list(store.read("s"))
    assert plain == logged  # exactly the log, as before deltas
    assert [item for item in asking if type(item) is not TextDelta] == logged
    assert text_of(asking) == "a b c"
    assert logged[-3].message.content == "a b c"  # the reply, logged once, whole


def test_a_reader_that_resumes_from_a_seq_reads_the_logged_events_only() -> None:
    asyncio.run(_resumes())


async def _resumes() -> None:
    store = open_store("memory:")
    async with AsyncOwner(store, "s", streaming_runner(words("one ", "two"))) as owner:
        live: list[Any] = []
        reading = asyncio.ensure_future(read_turn(owner.events(deltas=True), live))
        await asyncio.sleep(0)
        await owner.prompt("hi")
        await asyncio.wait_for(reading, WAIT)
        cut = next(item.seq for item in live if type(item) is ModelRequested)
        resumed: list[Any] = []
        await asyncio.wait_for(read_turn(owner.events(cut, deltas=True), resumed), WAIT)
    assert resumed == list(store.read("s", cut))  # the deltas were said once, to who listened


def test_a_reader_that_never_reads_does_not_slow_the_run_and_loses_no_text() -> None:
    asyncio.run(_never_reads())


async def _never_reads() -> None:
    pieces = [f"w{i} " for i in range(2000)]
    async with AsyncOwner(open_store("memory:"), "s", streaming_runner(words(*pieces))) as owner:
        await owner.inject("fyi")
        stuck = owner.events(deltas=True)
        first = await anext(stuck)  # listening from here on; never read again during the run
        sent = owner.prompt("hi")
        result = await asyncio.wait_for(sent, WAIT)  # the run ends while the reader is stuck
        assert result.text == "".join(pieces)
        assert await owner.wait_idle(WAIT)
        later: list[Any] = [first]
        await asyncio.wait_for(read_turn(stuck, later), WAIT)
        await stuck.aclose()
    # its unread pieces were joined, never dropped: the whole reply, in fewer deltas
    assert text_of(later) == "".join(pieces)
    assert len([item for item in later if type(item) is TextDelta]) < len(pieces)


def test_a_reader_made_before_its_owner_opened_gets_the_deltas_it_asked_for() -> None:
    asyncio.run(_made_before_open())


async def _made_before_open() -> None:
    owner = AsyncOwner(open_store("memory:"), "s", streaming_runner(words("Hel", "lo")))
    early = owner.events(deltas=True)  # made now, read once the owner is open
    async with owner:
        await owner.inject("fyi")
        seen: list[Any] = [await anext(early)]  # listening from here on
        assert (await owner.prompt("hi")).text == "Hello"
        await asyncio.wait_for(read_turn(early, seen), WAIT)
        await early.aclose()
    assert text_of(seen) == "Hello"


# -- the threaded Owner's follow() reader ------------------------------------------------------


def test_a_threaded_owner_s_follow_reader_gets_the_deltas_before_the_reply() -> None:
    store = open_store("memory:")
    owner = Owner(store, "s", streaming_runner(words("Hel", "lo")))
    try:
        reader = owner.follow(deltas=True, timeout=WAIT)
        handle = owner.prompt("hi")
        seen: list[Any] = []
        for item in reader:
            seen.append(item)
            if type(item) is TurnEnded:
                break
        assert handle.result(timeout=WAIT).text == "Hello"
    finally:
        owner.close()
    kinds = [type(item) for item in seen]
    assert text_of(seen) == "Hello"
    assert max(i for i, k in enumerate(kinds) if k is TextDelta) < kinds.index(ModelReplied)
    assert [item for item in seen if type(item) is not TextDelta] == list(store.read("s"))


def test_a_follow_reader_that_never_reads_does_not_slow_the_run() -> None:
    pieces = [f"w{i} " for i in range(2000)]
    owner = Owner(open_store("memory:"), "s", streaming_runner(words(*pieces)))
    try:
        owner.inject("fyi")
        stuck = owner.follow(deltas=True, timeout=WAIT)
        next(stuck)  # listening from here on; never read again during the run
        assert owner.prompt("hi").result(timeout=WAIT).text == "".join(pieces)
        later = []
        for item in stuck:
            later.append(item)
            if type(item) is TurnEnded:
                break
        assert text_of(later) == "".join(pieces)
    finally:
        owner.close()


def test_a_follow_reader_ends_when_its_owner_closes() -> None:
    owner = Owner(open_store("memory:"), "s", streaming_runner(words("x")))
    reader = owner.follow(timeout=WAIT)
    owner.inject("fyi")
    assert type(next(reader)).__name__ == "MessageSent"
    owner.close()
    assert list(reader) == []
    with pytest.raises(RuntimeError):
        owner.follow()


# -- the outlet and a reader's buffer ----------------------------------------------------------


def test_a_delta_said_on_another_thread_reaches_an_asyncio_reader_in_order() -> None:
    async def main() -> list[str]:
        feed = Feed(asyncio.get_running_loop())
        deltas = Deltas(lambda: (1, 1))
        deltas.subscribe(feed.delta)
        said = threading.Thread(target=lambda: [deltas.say(p) for p in ("a", "b", "c")])
        said.start()
        said.join()
        feed.put([None])
        got = []
        while (item := await feed.aget()) is not None:
            assert type(item) is TextDelta
            got.append(item.text)
        return got

    assert "".join(asyncio.run(main())) == "abc"


def test_a_delta_is_not_joined_across_an_event_or_into_another_step() -> None:
    feed = Feed()
    between: Event = Warned(text="an event between them", seq=1)
    feed.delta(TextDelta(text="a", turn=1, step=1))
    feed.put([between])
    feed.delta(TextDelta(text="b", turn=1, step=1))
    feed.delta(TextDelta(text="c", turn=1, step=2))
    assert [feed.get(timeout=0) for _ in range(4)] == [
        TextDelta(text="a", turn=1, step=1), between, TextDelta(text="b", turn=1, step=1),
        TextDelta(text="c", turn=1, step=2)]


def test_say_refuses_what_is_not_text_only_when_someone_listens() -> None:
    deltas = Deltas()
    deltas.say(42)  # type: ignore[arg-type]  # nobody listens: it costs nothing, checks nothing
    deltas.subscribe(lambda delta: None)
    with pytest.raises(TypeError, match="text must be a str, got int"):
        deltas.say(42)  # type: ignore[arg-type]


def test_a_port_without_an_outlet_gives_a_silent_one_nobody_can_subscribe_to() -> None:
    silent = deltas_of(LocalSession())
    silent.say("nobody hears this")
    assert not silent.listening
    with pytest.raises(TypeError, match="this port has no text-delta outlet"):
        silent.subscribe(lambda delta: None)


class ThreadedTurns:
    """A runner that records its turn on a thread of its own, as a framework run in a thread
    does, its model saying its reply as deltas right after the request is recorded there."""

    def __init__(self) -> None:
        self.inner = Runner(self.model)
        self.outlet: Deltas | None = None

    def model(self, transcript: Any, tools: Any) -> str:
        assert self.outlet is not None
        for piece in ("Hel", "lo"):
            self.outlet.say(piece)
        return "Hello"

    async def arun_turn(self, port: Any, **how: Any) -> AsyncIterator[Any]:
        self.outlet = deltas_of(port)
        for event in await asyncio.to_thread(lambda: list(self.inner.run_turn(port, **how))):
            yield event


@pytest.mark.parametrize("url", ["memory:", "sqlite"])
def test_a_step_s_deltas_come_after_its_request_whichever_thread_records_it(
    url: str, tmp_path: Any,
) -> None:
    async def main() -> list[Any]:
        store = open_store(f"sqlite:{tmp_path / 'db.sqlite'}" if url == "sqlite" else url)
        async with AsyncOwner(store, "s", ThreadedTurns()) as owner:
            await owner.inject("fyi")
            reader = owner.events(deltas=True)
            seen: list[Any] = [await anext(reader)]  # listening from here on
            await owner.steer("hi")
            await asyncio.wait_for(read_turn(reader, seen), WAIT)
            await reader.aclose()
        return seen

    seen = asyncio.run(main())
    kinds = [type(item) for item in seen]
    assert text_of(seen) == "Hello"
    assert kinds.index(ModelRequested) < kinds.index(TextDelta)
    assert max(i for i, k in enumerate(kinds) if k is TextDelta) < kinds.index(ModelReplied)
