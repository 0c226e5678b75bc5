"""The API behind a team's page: the list of sessions with their state, paged and filtered, at
the cost of what the server already knows; each queue's waiting messages; and the model's view at
each of its requests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
httpx = pytest.importorskip("httpx")

from nous_inbox.events import Event, MessageSent, ModelRequested  # noqa: E402
from nous_inbox.message import Message  # noqa: E402
from nous_inbox.runner import Runner  # noqa: E402
from nous_inbox.store import Store, open_store  # noqa: E402
from nous_inbox.web import SessionHost, create_app  # noqa: E402
from nous_inbox.web.routes import MAX_QUEUED  # noqa: E402

TOKEN = "test-token-1234"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class CountingStore:
    """A store that counts the events read from it: a list that replays a session reads them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.events_read = 0

    def read(self, stream: str, after: int = 0) -> Iterator[Event]:
        for event in self.store.read(stream, after):
            self.events_read += 1
            yield event

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def two_steps(transcript: Any, tools: Any) -> Message:
    """A model that reads a log once, then answers: two requests a turn."""
    if transcript[-1].role == "tool":
        return Message.assistant(f"read it, {len(transcript)} messages in")
    return Message.assistant(tool_calls=[{"id": f"c{len(transcript)}", "name": "read_log",
                                          "arguments": {}}])


def read_log() -> str:
    """Read the service's log."""
    return "all quiet"


def agent(session: str) -> Runner:
    return Runner(two_steps, tools=[read_log])


class Team:
    def __init__(self, store: CountingStore, host: SessionHost, client: Any) -> None:
        self.store, self.host, self.client = store, host, client

    async def get(self, path: str) -> Any:
        response = await self.client.get(path, headers=AUTH)
        assert response.status_code == 200, response.text
        return response.json()

    async def send(self, session: str, mode: str, text: str) -> int:
        response = await self.client.post(f"/api/sessions/{session}/messages", headers=AUTH,
                                          json={"mode": mode, "text": text})
        assert response.status_code == 202, response.text
        seq: int = response.json()["seq"]
        return seq

    async def run(self, session: str, text: str) -> None:
        await self.send(session, "prompt", text)
        owner = self.host.hosted(session)
        assert owner is not None
        await owner.wait_idle()


@pytest.fixture
async def team(tmp_path: Path) -> AsyncIterator[Team]:
    with open_store(f"sqlite:{tmp_path / 'log.sqlite'}") as inner:
        store = CountingStore(inner)
        async with SessionHost(store, agent, scan_interval=None) as host:
            app = create_app(host, token=TOKEN)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app),
                                         base_url="http://test") as client:
                yield Team(store, host, client)


def stored_elsewhere(store: CountingStore, session: str, *texts: str) -> None:
    """Sends written to the store by another process: queued, waking nothing."""
    store.store.append(session, [MessageSent(target="next_turn", wakeup=False,
                                             message=Message.user(text)) for text in texts])


# -- the list ---------------------------------------------------------------------------------


async def test_the_list_is_paged_and_filtered_by_id_prefix(team: Team) -> None:
    for name in ("ops-2", "dev-1", "ops-1", "ops-10", "opt", "dev-2"):
        stored_elsewhere(team.store, name, "hello")
    listed = await team.get("/api/sessions?prefix=ops-&limit=2")
    assert ([s["id"] for s in listed["sessions"]], listed["total"]) == (["ops-1", "ops-10"], 3)
    rest = await team.get("/api/sessions?prefix=ops-&offset=2&limit=2")
    assert ([s["id"] for s in rest["sessions"]], rest["total"], rest["offset"]) == (["ops-2"], 3, 2)
    assert (await team.get("/api/sessions?prefix=ops-&offset=9"))["sessions"] == []
    everything = await team.get("/api/sessions")
    assert everything["total"] == 6 and len(everything["sessions"]) == 6
    assert (await team.get("/api/sessions?prefix=zz"))["total"] == 0


async def test_a_held_session_is_listed_with_its_run_and_its_queues(team: Team) -> None:
    await team.run("ops", "check the deploy")
    await team.send("ops", "inject", "fyi: the cdn is slow")
    owner = team.host.hosted("ops")
    assert owner is not None
    (listed,) = (await team.get("/api/sessions"))["sessions"]
    session = owner.session
    assert listed == {"id": "ops", "hosted": True, "state": {
        "version": session.version, "running": False, "turn": session.turn,
        "step": session.step,
        "inbox": {"next_turn": session.inbox.count("next_turn"),
                  "next_step": session.inbox.count("next_step"),
                  "wants_wake": session.inbox.wants_wake()}}}
    assert listed["state"]["inbox"]["next_step"] == 1  # the inject waits for a step


async def test_a_session_not_held_here_shows_what_the_last_scan_read_or_says_it_is_unread(
        team: Team) -> None:
    stored_elsewhere(team.store, "quiet", "one", "two")
    (unread,) = (await team.get("/api/sessions"))["sessions"]
    assert unread == {"id": "quiet", "hosted": False, "state": None}
    await team.host.scan()  # what the server does every --scan-interval
    (read,) = (await team.get("/api/sessions"))["sessions"]
    assert read["hosted"] is False
    assert read["state"]["inbox"] == {"next_turn": 2, "next_step": 0, "wants_wake": False}
    assert read["state"]["version"] == 2


async def test_listing_many_sessions_replays_none_of_them(team: Team) -> None:
    for n in range(300):
        stored_elsewhere(team.store, f"s{n:03}", "hello", "again")
    await team.run("s000", "go")
    before = team.store.events_read
    listed = await team.get("/api/sessions?limit=500")
    assert listed["total"] == 300
    assert team.store.events_read == before  # names only: no session's log is read


@pytest.mark.parametrize(("query", "says"), [
    ("prefix=a%01", "prefix: session id prefix 'a\\x01' contains a control character"),
    ("prefix=" + "x" * 300, "prefix: session id prefix"),
    ("prefix=a&prefix=b", "query parameter prefix is given more than once"),
    ("limit=x", "limit must be a whole number >= 0"),
    ("colour=red", "unknown query parameter 'colour': it takes offset, limit, prefix"),
])
async def test_a_bad_list_query_is_refused_naming_it(team: Team, query: str, says: str) -> None:
    response = await team.client.get(f"/api/sessions?{query}", headers=AUTH)
    assert response.status_code == 400
    assert says in response.json()["error"]


# -- the queues -------------------------------------------------------------------------------


def said(queued: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    """The queues as what their messages say: a message sent inside a traced request carries
    its sender's ``traceparent`` in its metadata when a tracer is configured in the process."""
    return {queue: [{**entry, "message": {key: entry["message"][key] for key in ("role", "content")}}
                    for entry in entries] for queue, entries in queued.items()}


async def test_a_session_shows_the_messages_waiting_on_each_queue(team: Team) -> None:
    await team.run("ops", "check the deploy")
    fyi = await team.send("ops", "inject", "fyi: the cdn is slow")
    also = await team.send("ops", "inject", "and the db")
    queued = said((await team.get("/api/sessions/ops"))["queued"])
    assert queued == {"next_turn": [], "next_step": [
        {"seq": fyi, "wakeup": False, "message": {"role": "user", "content": "fyi: the cdn is slow"}},
        {"seq": also, "wakeup": False, "message": {"role": "user", "content": "and the db"}}]}
    # Held elsewhere (here: by no one), read from the log: a waking send says so.
    team.store.store.append("elsewhere", [
        MessageSent(target="next_turn", wakeup=True, message=Message.user("then write it up")),
        MessageSent(target="next_step", wakeup=True, message=Message.user("stop")),
    ])
    queued = said((await team.get("/api/sessions/elsewhere"))["queued"])
    assert queued == {
        "next_turn": [{"seq": 1, "wakeup": True, "message": {"role": "user",
                                                               "content": "then write it up"}}],
        "next_step": [{"seq": 2, "wakeup": True, "message": {"role": "user", "content": "stop"}}]}


async def test_a_withdrawn_message_leaves_its_queue(team: Team) -> None:
    stored_elsewhere(team.store, "quiet", "one", "two")
    response = await team.client.post("/api/sessions/quiet/messages/1/withdraw", headers=AUTH)
    assert response.json()["state"] == "withdrawn"
    queued = (await team.get("/api/sessions/quiet"))["queued"]
    assert [entry["seq"] for entry in queued["next_turn"]] == [2]


async def test_a_long_queue_shows_its_first_messages_and_its_count(team: Team) -> None:
    stored_elsewhere(team.store, "backlog", *(f"m{n}" for n in range(MAX_QUEUED + 5)))
    shown = await team.get("/api/sessions/backlog?limit=0")
    assert shown["inbox"]["next_turn"] == MAX_QUEUED + 5
    entries = shown["queued"]["next_turn"]
    assert [e["message"]["content"] for e in entries] == [f"m{n}" for n in range(MAX_QUEUED)]


# -- the model's view -------------------------------------------------------------------------


def requests_of(store: CountingStore, session: str) -> list[ModelRequested]:
    return [e for e in store.store.read(session) if isinstance(e, ModelRequested)]


async def test_the_view_at_each_model_request_is_what_the_model_was_shown(team: Team) -> None:
    await team.run("ops", "check the deploy")
    await team.send("ops", "steer", "the cdn first")
    owner = team.host.hosted("ops")
    assert owner is not None
    await owner.wait_idle()
    await team.run("ops", "now write it up")
    transcript = [msgspec_plain(m) for m in owner.transcript]
    requests = requests_of(team.store, "ops")
    assert len(requests) >= 4
    for request in requests:
        view = await team.get(f"/api/sessions/ops/view/{request.seq}?limit=500")
        assert view == {"seq": request.seq, "turn": request.turn, "step": request.step,
                        "count": request.count, "offset": 0,
                        "messages": transcript[:request.count]}
    assert [r.count for r in requests] == sorted(r.count for r in requests)


async def test_the_view_is_paged_and_read_from_the_log_for_a_session_not_held_here(
        team: Team, tmp_path: Path) -> None:
    await team.run("ops", "check the deploy")
    owner = team.host.hosted("ops")
    assert owner is not None
    transcript = [msgspec_plain(m) for m in owner.transcript]
    await owner.aclose()  # let go: another process may hold it now
    assert team.host.hosted("ops") is None
    last = requests_of(team.store, "ops")[-1]
    view = await team.get(f"/api/sessions/ops/view/{last.seq}?offset=1&limit=1")
    assert (view["offset"], view["messages"]) == (1, transcript[1:2])
    beyond = await team.get(f"/api/sessions/ops/view/{last.seq}?offset=99")
    assert (beyond["offset"], beyond["messages"]) == (last.count, [])


async def test_the_view_of_another_event_or_of_no_event_is_404_saying_which(team: Team) -> None:
    await team.run("ops", "check the deploy")
    response = await team.client.get("/api/sessions/ops/view/1", headers=AUTH)
    assert response.status_code == 404
    assert "the event at seq 1 is message_sent, not model_requested" in response.json()["error"]
    for path in ("/api/sessions/ops/view/999", "/api/sessions/nobody/view/1"):
        response = await team.client.get(path, headers=AUTH)
        assert response.status_code == 404 and "has no event at seq" in response.json()["error"]
    response = await team.client.get("/api/sessions/ops/view/0", headers=AUTH)
    assert response.status_code == 400 and "seq must be a whole number >= 1" in response.text


def msgspec_plain(message: Message) -> Any:
    import msgspec

    return msgspec.json.decode(msgspec.json.encode(message))
