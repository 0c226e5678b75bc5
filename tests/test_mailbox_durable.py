"""Durable sends share transactions: sends from several threads that arrive while one commits go
in the next commit together (the owners' group commit), each sender still answered only once its
own transaction committed; a send that needs more than its message (a full queue) is sent on its
own, and fails only its sender. In memory and on SQLite, each folded back from the log.

The batches are made deterministically: the store holds the first append until the other senders
are queued behind it. Timing is measured in ``bench/``, never here.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from nous_inbox.events import MailSent
from nous_inbox.mailbox import Mailbox, MailboxFullError, MailboxState, Receipt
from nous_inbox.store import Store
from tests.helpers import wait_until

WAIT = 10.0  # seconds: a bound for a wait that should end at once, never a sync sleep


@pytest.fixture(params=["memory", "sqlite"])
def kind(request: pytest.FixtureRequest) -> str:
    """In memory and on SQLite (this module's stores)."""
    return str(request.param)


class _Held:
    """A blocking store whose first append waits for ``release``; records each append's size."""

    blocking = True

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.sizes: list[int] = []
        self.entered, self.release = threading.Event(), threading.Event()

    def append(self, stream: str, events: Sequence[Any], expected_version: int | None = None,
               ) -> Any:
        self.sizes.append(sum(type(e) is MailSent for e in events))
        if len(self.sizes) == 1:
            self.entered.set()
            assert self.release.wait(WAIT)
        return self.inner.append(stream, events, expected_version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _burst(store: Store, sends: Sequence[tuple[str, str]], **options: Any,
           ) -> tuple[_Held, Mailbox, dict[str, Receipt | BaseException]]:
    """A first send held in its commit, then ``sends`` (recipient, text) from a thread each."""
    held = _Held(store)
    box = Mailbox(held, **options)
    results: dict[str, Receipt | BaseException] = {}
    handles = {text: box.agent(f"peer-{text}") for text in ["first", *[t for _, t in sends]]}

    def send(recipient: str, text: str) -> None:
        try:
            results[text] = handles[text].send(recipient, text)
        except BaseException as exc:  # recorded, asserted by the test
            results[text] = exc

    threads = [threading.Thread(target=send, args=("dev", "first"), daemon=True)]
    threads[0].start()
    assert held.entered.wait(WAIT)
    threads += [threading.Thread(target=send, args=s, daemon=True) for s in sends]
    for thread in threads[1:]:
        thread.start()
    wait_until(lambda: box.sends_waiting == len(sends), what="the other sends queued", timeout=WAIT)
    held.release.set()
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive()
    folded = MailboxState()
    for event in store.read("mailbox"):
        folded.apply(event)
    assert folded == box.state
    return held, box, results


def test_sends_that_arrive_during_a_commit_share_the_next_one(store: Store) -> None:
    held, box, results = _burst(store, [("dev", f"m{i}") for i in range(8)])
    assert held.sizes == [1, 8]
    assert all(isinstance(r, Receipt) and r.state == "queued" for r in results.values())
    assert box.pending("dev") == 9


def test_a_send_beyond_the_bound_fails_alone_and_the_others_go(store: Store) -> None:
    held, box, results = _burst(store, [("dev", "second"), ("dev", "third"), ("qa", "q1")],
                                max_queue=2)
    assert isinstance(results.pop("third"), MailboxFullError)
    assert {r.state for r in results.values() if isinstance(r, Receipt)} == {"queued"}
    assert len(results) == 3
    assert held.sizes == [1, 1, 1]  # the batch was refused unwritten, then sent one by one
    assert box.pending("dev") == 2 and box.pending("qa") == 1
