"""Every face sends the same way: one table of verbs says where each send waits and whether it
wakes; every face offers the table's verbs and means by each what the table says; and a send
whose store could not learn its outcome is stored once, whichever face made it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

from nous_inbox.__main__ import main
from nous_inbox.cli.parser import build_parser
from nous_inbox.cli.render import format_event
from nous_inbox.cli.style import Style
from nous_inbox.errors import OutcomeUnknownError
from nous_inbox.events import Event, MessageSent, TurnStarted
from nous_inbox.inbox import Inbox
from nous_inbox.mailbox.rules import Plan
from nous_inbox.message import Message
from nous_inbox.owner import Owner
from nous_inbox.owner.async_owner import AsyncOwner
from nous_inbox.owner.turn_result import AsyncTurnHandle, TurnHandle
from nous_inbox.runner import LocalSession, Runner
from nous_inbox.store import Store, open_store
from nous_inbox.verbs import FOLLOWUP, INJECT, PROMPT, STEER, VERBS, Target, Verb, as_verb, name_of
from nous_inbox.web.host import SessionHost

WAIT = 20.0  # seconds: a bound for what should happen soon, never a sleep to synchronise
QUEUE_VERBS = [STEER, INJECT, FOLLOWUP]  # the verbs a queue offers; a prompt is an owner's


def ids(verb: Verb) -> str:
    return verb.name


def answer(transcript: object, tools: object) -> str:
    return "done"


def sends(events: list[Event]) -> list[tuple[str, bool, str]]:
    return [(str(e.target), e.wakeup, e.message.content) for e in events
            if isinstance(e, MessageSent)]


def cli(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


# -- the table ---------------------------------------------------------------------------------


def test_the_table_holds_the_four_verbs_with_their_queue_and_wake() -> None:
    assert [(v.name, v.target, v.wakeup, v.own_turn) for v in VERBS.values()] == [
        ("steer", Target.NEXT_STEP, True, False),
        ("inject", Target.NEXT_STEP, False, False),
        ("followup", Target.NEXT_TURN, True, False),
        ("prompt", Target.NEXT_TURN, True, True),  # waits as a followup; a turn of its own
    ]


def test_a_stored_send_reads_as_the_first_verb_with_its_queue_and_wake() -> None:
    assert name_of(PROMPT.target, PROMPT.wakeup) == "followup"  # the log has one form for both
    assert [name_of(v.target, v.wakeup) for v in QUEUE_VERBS] == ["steer", "inject", "followup"]
    assert name_of("next_turn", False) is None  # a send, but no verb's


def test_a_name_that_is_no_verb_is_refused_naming_the_verbs() -> None:
    with pytest.raises(ValueError, match="mode must be one of steer, inject, followup, prompt, "
                                         "got 'nudge'"):
        as_verb("nudge", "mode")


# -- every face's verbs are the table's ----------------------------------------------------------


@pytest.mark.parametrize("verb", QUEUE_VERBS, ids=ids)
def test_the_inbox_presets_are_the_table(verb: Verb) -> None:
    message = Message.user("x")
    assert getattr(Inbox(), verb.name)(message) == Inbox().send(message, verb.target, verb.wakeup)


@pytest.mark.parametrize("verb", QUEUE_VERBS, ids=ids)
def test_a_local_session_sends_each_verb_as_the_table_says(verb: Verb) -> None:
    local = LocalSession()
    getattr(local, verb.name)("x")
    assert sends(list(local.events)) == [(verb.target, verb.wakeup, "x")]


def opened_turns(events: list[Event]) -> list[str]:
    return [e.reason for e in events if isinstance(e, TurnStarted)]


def expected_turns(verb: Verb) -> list[str]:
    """What the table says a verb sent to an idle owner opens: a turn of its own (a prompt's), a
    turn it wakes, or none."""
    return ["prompt"] if verb.own_turn else ["wake"] if verb.wakeup else []


@pytest.mark.parametrize("verb", list(VERBS.values()), ids=ids)
def test_the_threaded_owner_sends_each_verb_as_the_table_says(verb: Verb) -> None:
    with open_store("memory:") as store:
        owner = Owner(store, "s", Runner(answer))
        try:
            sent = getattr(owner, verb.name)("x")
            sent = sent.sent if isinstance(sent, TurnHandle) else sent
            assert (sent.target, sent.wakeup) == (verb.target, verb.wakeup)
            assert owner.wait_idle(timeout=WAIT)
            events = owner.events()
        finally:
            owner.close()
    assert sends(events) == [(verb.target, verb.wakeup, "x")]
    assert opened_turns(events) == expected_turns(verb)


@pytest.mark.parametrize("verb", list(VERBS.values()), ids=ids)
def test_the_asyncio_owner_sends_each_verb_as_the_table_says(verb: Verb) -> None:
    async def run(store: Store) -> None:
        async with AsyncOwner(store, "s", Runner(answer)) as owner:
            sending = getattr(owner, verb.name)("x")
            sent = await (sending.stored() if isinstance(sending, AsyncTurnHandle) else sending)
            assert (sent.target, sent.wakeup) == (verb.target, verb.wakeup)
            assert await owner.wait_idle(timeout=WAIT)

    with open_store("memory:") as store:
        asyncio.run(run(store))
        events = list(store.read("s"))
    assert sends(events) == [(verb.target, verb.wakeup, "x")]
    assert opened_turns(events) == expected_turns(verb)


def test_the_command_line_has_one_send_command_a_verb() -> None:
    commands = re.findall(r"^    ([a-z]+)\s", build_parser().format_help(), re.M)
    assert "show" in commands and "serve" not in commands  # every command of the command line
    sending = []
    for command in commands:
        with contextlib.suppress(SystemExit):  # a command that takes other arguments
            args, _ = build_parser().parse_known_args([command, "s", "text"])
            if args.handler == "send":
                sending.append(command)
    assert sending == list(VERBS)


@pytest.mark.parametrize("verb", list(VERBS.values()), ids=ids)
def test_the_command_line_stores_each_verb_as_the_table_says(verb: Verb, tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path / 'log.sqlite'}"
    assert cli(verb.name, "--create", "--store", url, "s", "x")[0] == 0
    with open_store(url) as store:
        assert sends(list(store.read("s"))) == [(verb.target, verb.wakeup, "x")]


@pytest.mark.parametrize("verb", list(VERBS.values()), ids=ids)
def test_a_log_line_names_a_send_by_the_table(verb: Verb) -> None:
    line = format_event(MessageSent(seq=1, target=verb.target, wakeup=verb.wakeup,
                                    message=Message.user("x")), Style(None, force=False),
                        with_time=False)
    assert line.split()[1] == ("followup" if verb.own_turn else verb.name)


def test_every_way_the_mailbox_hands_a_notice_over_is_a_verb_or_the_one_no_verb_names() -> None:
    how, _ = get_args(Plan)
    literal, _none = get_args(how)
    assert set(get_args(literal)) - {"join"} <= set(VERBS)  # join: next turn, no wake


@pytest.mark.parametrize("verb", list(VERBS.values()), ids=ids)
def test_the_web_host_sends_each_verb_as_the_table_says(verb: Verb, tmp_path: Path) -> None:
    async def run() -> MessageSent:
        with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
            async with SessionHost(store, lambda name: Runner(answer), scan_interval=None) as host:
                return await host.send("s", verb.name, "x")

    sent = asyncio.run(run())
    assert (sent.target, sent.wakeup) == (verb.target, verb.wakeup)


def test_the_web_host_refuses_a_mode_that_is_no_verb(tmp_path: Path) -> None:
    async def run() -> None:
        with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as store:
            async with SessionHost(store, lambda name: Runner(answer), scan_interval=None) as host:
                with pytest.raises(ValueError, match="one of steer, inject, followup, prompt"):
                    await host.send("s", "nudge", "x")
            assert store.streams() == []

    asyncio.run(run())


def test_the_page_offers_one_button_a_verb() -> None:
    pytest.importorskip("starlette")
    httpx = pytest.importorskip("httpx")
    from nous_inbox.web import create_app

    async def run() -> str:
        async with SessionHost(open_store("memory:"), lambda name: Runner(answer),
                               scan_interval=None) as host:
            transport = httpx.ASGITransport(create_app(host, token="t" * 16))
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                page = await client.get("/")
                assert page.status_code == 200
                return str(page.text)

    page = asyncio.run(run())
    buttons = re.findall(r'data-mode="(\w+)" data-target="(\w+)" data-wakeup="(\w+)"', page)
    assert buttons == [(v.name, v.target, str(v.wakeup).lower()) for v in VERBS.values()]


# -- a send whose outcome the store could not learn is stored once, by every face -----------------


@contextlib.contextmanager
def answer_lost_once(store_type: type[Any], written: bool) -> Iterator[None]:
    """The store's first append of a send raises ``OutcomeUnknownError``: after writing it (the
    answer was lost on the way back) or without writing it (the connection dropped first)."""
    real = store_type.append
    armed = [True]

    def append(self: Any, stream: str, events: Any, expected_version: Any = None, *,
               identity: Any = None) -> Any:
        if armed[0] and any(isinstance(event, MessageSent) for event in events):
            armed[0] = False
            if written:
                real(self, stream, events, expected_version, identity="send-1")
            raise OutcomeUnknownError("the answer was lost", stream=stream, identity="send-1")
        return real(self, stream, events, expected_version, identity=identity)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store_type, "append", append)
        yield


def owner_steers(store: Store, url: str) -> int:
    owner = Owner(store, "s", Runner(answer))
    try:
        seq = owner.steer("go").seq
        assert owner.wait_idle(timeout=WAIT)
        return seq
    finally:
        owner.close()


def asyncio_owner_steers(store: Store, url: str) -> int:
    async def run() -> int:
        async with AsyncOwner(store, "s", Runner(answer)) as owner:
            seq = (await owner.steer("go")).seq
            assert await owner.wait_idle(timeout=WAIT)
            return seq

    return asyncio.run(run())


def web_host_steers(store: Store, url: str) -> int:
    async def run() -> int:
        async with SessionHost(store, lambda name: Runner(answer), scan_interval=None) as host:
            seq = (await host.send("s", "steer", "go")).seq
            owner = host.hosted("s")
            assert owner is not None and await owner.wait_idle(timeout=WAIT)
            return seq

    return asyncio.run(run())


def web_host_steers_a_session_held_elsewhere(store: Store, url: str) -> int:
    async def run() -> int:
        async with SessionHost(store, lambda name: Runner(answer), scan_interval=None) as host:
            with store.own("s"):  # another process's owner holds it: the send goes to the log
                sent = await host.send("s", "steer", "go")
                assert host.hosted("s") is None
                return sent.seq

    return asyncio.run(run())


def command_line_steers(store: Store, url: str) -> int:
    status, out = cli("steer", "--create", "--store", url, "s", "go")
    assert status == 0, out
    found = re.search(r"as event #(\d+)", out)
    assert found is not None, out
    return int(found.group(1))


FACES: dict[str, Callable[[Store, str], int]] = {
    "owner": owner_steers,
    "asyncio owner": asyncio_owner_steers,
    "web host": web_host_steers,
    "web host, held elsewhere": web_host_steers_a_session_held_elsewhere,
    "command line": command_line_steers,
}


@pytest.mark.parametrize("written", [True, False], ids=["written", "not written"])
@pytest.mark.parametrize("face", list(FACES))
def test_a_send_whose_outcome_is_unknown_is_stored_once_by_every_face(
    face: str, written: bool, tmp_path: Path
) -> None:
    url = f"sqlite:{tmp_path / 'log.sqlite'}"
    with open_store(url) as store, answer_lost_once(type(store), written):
        seq = FACES[face](store, url)
        stored = list(store.read("s"))
    assert seq == 1
    assert sends(stored) == [("next_step", True, "go")]
