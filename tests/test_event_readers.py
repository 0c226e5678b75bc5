"""The live readers of an asyncio owner's events: each reads the stored events, then those told as
they are recorded, every seq once and in order (a repeat of what the store gave is dropped, a gap
is filled from the store), until the owner ends them; closing a reader stops its listening."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nous_inbox.events import Event, Warned
from nous_inbox.owner.event_readers import EventReaders

LOG = [Warned(text=f"event {seq}", seq=seq) for seq in range(1, 21)]


class Store:
    """A store holding the first ``held`` events of LOG; it notes each position it is read
    after, and says when it is first read (the reader listens from before that)."""

    def __init__(self, held: int) -> None:
        self.held, self.reads, self.read = held, list[int](), asyncio.Event()

    async def stored(self, after: int) -> list[Event]:
        self.reads.append(after)
        self.read.set()
        return [event for event in LOG[:self.held] if event.seq > after]


async def seqs(reader: AsyncIterator[Event]) -> list[int]:
    return [event.seq async for event in reader]


def nothing_to_check() -> None:
    return None


@given(after=st.integers(0, 10), held=st.integers(0, 20), data=st.data())
def test_a_reader_sees_every_later_seq_once_in_order(after: int, held: int,
                                                      data: st.DataObject) -> None:
    # What is told starts anywhere from the events the store held already (repeats) to the one
    # right after them, and goes on to the end of the log, in batches.
    first = data.draw(st.integers(after + 1, max(after + 1, held + 1)), label="first told")
    cuts = sorted(data.draw(st.sets(st.integers(first, 21)), label="batch cuts") | {first, 21})
    batches = [LOG[start - 1:end - 1] for start, end in itertools.pairwise(cuts)]

    async def main() -> list[int]:
        readers, store = EventReaders(), Store(held)
        reading = asyncio.create_task(seqs(readers.read(after, store.stored, nothing_to_check)))
        await store.read.wait()
        for batch in batches:
            readers.tell(batch)
        readers.end()
        return await reading

    assert asyncio.run(main()) == list(range(after + 1, 21))


def test_a_gap_in_what_is_told_is_filled_from_the_store() -> None:
    store = Store(1)

    async def main() -> list[int]:
        readers = EventReaders()
        reading = asyncio.create_task(seqs(readers.read(0, store.stored, nothing_to_check)))
        await store.read.wait()
        store.held = 5
        readers.tell([LOG[0]])
        readers.tell([LOG[4]])  # seq 5: 2 to 4 were never told
        readers.end()
        return await reading

    assert asyncio.run(main()) == [1, 2, 3, 4, 5]
    assert store.reads == [0, 1]  # the first read, then the one that filled the gap


def test_closing_a_reader_stops_its_listening_and_ending_ends_the_others() -> None:
    store = Store(1)

    async def main() -> tuple[bool, list[int], bool]:
        readers = EventReaders()
        closed = readers.read(0, store.stored, nothing_to_check)
        kept = readers.read(0, store.stored, nothing_to_check)
        await anext(closed), await anext(kept)
        listening = bool(readers)
        await closed.aclose()
        readers.tell([LOG[1]])
        readers.end()
        rest = await seqs(kept)  # what was told before the end, then no more
        return listening, rest, bool(readers)  # nobody listens: the closed one stopped too

    assert asyncio.run(main()) == (True, [2], False)


def test_a_bad_position_or_an_unreadable_owner_raises_as_the_reading_starts() -> None:
    store = Store(0)

    def closed() -> None:
        raise RuntimeError("the owner is closed")

    async def main() -> None:
        readers = EventReaders()
        bad = readers.read("3", store.stored, nothing_to_check)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="after must be an int seq, got str"):
            await anext(bad)
        with pytest.raises(RuntimeError, match="closed"):
            await anext(readers.read(0, store.stored, closed))
        assert not readers and not store.reads  # neither listened nor read

    asyncio.run(main())
