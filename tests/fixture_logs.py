"""The fixture logs of ``tests/data``: one short run, as each schema version of nous-inbox wrote it.

``sample(version)`` is that run in the event vocabulary of ``version``: a session ``run`` (a
followup, a turn of two steps with a tool call and a steer that arrived during the tool, then a
turn that a nudge carries on and a cancel ends; from schema 4, a followup then withdrawn; from
schema 5, a turn its holder let go at a boundary, ended as released and carried on) and
the mailbox's stream ``mailbox`` (mail sent,
noticed, read, answered, received, withdrawn and dropped), each append as it was batched.
From schema 2 on, the run holds every event type of its version, so the newest fixtures show
every record this version writes.

A new schema version's fixtures are written by that version, once, and never again:

    python -m tests.fixture_logs tests/data

writes ``schemaN.jsonl`` (the ``file:`` store), ``schemaN.msgpack`` (a framed MessagePack log)
and ``schemaN.sqlite`` (the ``sqlite:`` store) for the running library's ``SCHEMA_VERSION``,
refusing to overwrite any. Schema 1's were written by nous-inbox 0.x before this module existed.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from nous_inbox.codec import Record, msgpack_frames
from nous_inbox.events import (
    SCHEMA_VERSION,
    CancelRequested,
    Event,
    MailAgent,
    MailAnswered,
    MailDropped,
    MailNoticed,
    MailRead,
    MailReceived,
    MailSent,
    MailWithdrawn,
    MessageSent,
    MessageWithdrawn,
    ModelReplied,
    ModelRequested,
    Nudged,
    QueueClaimed,
    SessionReleased,
    StepEnded,
    StepStarted,
    ToolCalled,
    ToolReturned,
    TurnEnded,
    TurnStarted,
    Warned,
)
from nous_inbox.message import Message, ToolCall
from nous_inbox.store import open_store
from nous_inbox.verbs import Target

#: Where the run's clock starts: every event's ``at`` is this plus its seq, so a fixture is the
#: same bytes whenever it is written.
EPOCH = 1764500000.0

#: The transcript each session ``run`` of schema 2 to 4 replays to.
TRANSCRIPT = [
    "tidy the staging logs", "", "42 lines", "check a.log only", "a.log has 42 lines",
    "now the rest", "looking", "Continue.", "stopping",
]


def transcript(version: int) -> list[str]:
    """The transcript session ``run`` of schema ``version`` (2 or later) replays to."""
    return TRANSCRIPT + (["go on", "", "42 lines", "all 42 read"] if version >= 5 else [])


def sample(version: int) -> dict[str, list[list[Event]]]:
    """The run, stream by stream and append by append, as schema ``version`` (2 or later) has it."""
    if version < 2:
        raise ValueError("schema 1's fixtures were written by nous-inbox 0.x; they are not remade")
    new = version >= 3
    read = ToolCall("c1", "read", {"path": "a.log"})
    run: list[list[Event]] = [
        [MessageSent(target=Target.NEXT_TURN, wakeup=True,
                     message=Message.user("tidy the staging logs"))],
        [TurnStarted(turn=1), QueueClaimed(target=Target.NEXT_TURN, count=1),
         QueueClaimed(target=Target.NEXT_STEP, count=0)],
        [StepStarted(turn=1, step=1), ModelRequested(turn=1, step=1, count=1)],
        [ModelReplied(turn=1, step=1, message=Message.assistant("", tool_calls=[read])),
         ToolCalled(turn=1, step=1, call=read)],
        [MessageSent(target=Target.NEXT_STEP, wakeup=True, message=Message.user("check a.log only"))],
        [ToolReturned(turn=1, step=1, message=Message.tool("42 lines", "c1", name="read")),
         StepEnded(turn=1, step=1), QueueClaimed(target=Target.NEXT_STEP, count=1)],
        [StepStarted(turn=1, step=2), ModelRequested(turn=1, step=2, count=4)],
        [ModelReplied(turn=1, step=2, message=Message.assistant("a.log has 42 lines")),
         StepEnded(turn=1, step=2), QueueClaimed(target=Target.NEXT_STEP, count=0),
         TurnEnded(turn=1, steps=2, reason="final",
                   **({"output": {"lines": 42}, "usage": {"input_tokens": 120, "output_tokens": 9}}
                      if new else {}))],
        [MessageSent(target=Target.NEXT_TURN, wakeup=True, message=Message.user("now the rest"))],
        [TurnStarted(turn=2), QueueClaimed(target=Target.NEXT_TURN, count=1),
         QueueClaimed(target=Target.NEXT_STEP, count=0)],
        [StepStarted(turn=2, step=1), ModelRequested(turn=2, step=1, count=6)],
        [ModelReplied(turn=2, step=1, message=Message.assistant("looking")),
         StepEnded(turn=2, step=1), QueueClaimed(target=Target.NEXT_STEP, count=0),
         Nudged(turn=2, step=1, message=Message.user("Continue.",
                                                     metadata={"provenance": "continuation"})),
         StepStarted(turn=2, step=2), ModelRequested(turn=2, step=2, count=8)],
        [Warned(text="the model is slow to answer")],
        *([[CancelRequested(turn=2)]] if new else []),
        [ModelReplied(turn=2, step=2, message=Message.assistant("stopping")),
         StepEnded(turn=2, step=2), TurnEnded(turn=2, steps=2, reason="cancelled")],
    ]
    if version >= 4:  # a followup sent after the cancel, then taken back before any turn
        sent = sum(map(len, run)) + 1
        run += [[MessageSent(target=Target.NEXT_TURN, wakeup=True,
                             message=Message.user("one more thing"))],
                [MessageWithdrawn(sent=sent, target=Target.NEXT_TURN)]]
    if version >= 5:  # a turn let go at a step boundary, then carried on by the next holder
        run += [[MessageSent(target=Target.NEXT_TURN, wakeup=True, message=Message.user("go on"))],
                [TurnStarted(turn=3), QueueClaimed(target=Target.NEXT_TURN, count=1),
                 QueueClaimed(target=Target.NEXT_STEP, count=0)],
                [StepStarted(turn=3, step=1), ModelRequested(turn=3, step=1, count=10)],
                [ModelReplied(turn=3, step=1, message=Message.assistant("", tool_calls=[read])),
                 ToolCalled(turn=3, step=1, call=read)],
                [ToolReturned(turn=3, step=1, message=Message.tool("42 lines", "c1", name="read")),
                 StepEnded(turn=3, step=1)],
                [SessionReleased(turn=3)],
                [TurnEnded(turn=3, steps=1, reason="released")],
                [TurnStarted(turn=4, reason="resumed"), QueueClaimed(target=Target.NEXT_STEP, count=0)],
                [StepStarted(turn=4, step=1), ModelRequested(turn=4, step=1, count=13)],
                [ModelReplied(turn=4, step=1, message=Message.assistant("all 42 read")),
                 StepEnded(turn=4, step=1), QueueClaimed(target=Target.NEXT_STEP, count=0),
                 TurnEnded(turn=4, steps=1, reason="final")]]
    mailbox: list[list[Event]] = [
        *([[MailAgent(agent="dev", parent="lead")]] if new else []),
        [MailSent(id="m1", sender="lead", recipient="dev", body={"task": "tidy", "logs": ["a.log"]},
                  thread="lead")],
        [MailSent(id="m2", sender="qa", recipient="dev", body="fyi: green", kind="fyi",
                  thread="qa")],
        [MailNoticed(recipient="dev", notice="n1", ids=("m1", "m2"))],
        [MailRead(recipient="dev", ids=("m1",))],
        [MailSent(id="m3", sender="dev", recipient="lead", body="done", kind="reply",
                  thread="lead", reply_to="m1"),
         MailAnswered(recipient="dev", ids=("m1",), by="m3")],
        [MailReceived(recipient="lead", ids=("m3",))],
        [MailSent(id="m4", sender="lead", recipient="dev", body="scratch that", thread="lead")],
        [MailWithdrawn(id="m4", recipient="dev")],
        [MailDropped(id="m2", recipient="dev")],
        *([[MailAgent(agent="dev", worked=True)]] if new else []),
    ]
    return {"run": _stamped(run), "mailbox": _stamped(mailbox)}


def _stamped(appends: list[list[Event]]) -> list[list[Event]]:
    """The appends with each event's seq and time, as the store stamps them."""
    import msgspec

    seq = 0
    out = []
    for batch in appends:
        stamped = []
        for event in batch:
            seq += 1
            stamped.append(msgspec.structs.replace(event, seq=seq, at=EPOCH + seq))
        out.append(stamped)
    return out


def events(version: int, stream: str) -> list[Event]:
    """The events of ``stream`` in ``sample(version)``, in order."""
    return [event for batch in sample(version)[stream] for event in batch]


def records(version: int) -> list[Record]:
    """The records a multi-stream log holds for the sample, append by append: ``more`` counts
    the records of the same append after each one."""
    out = []
    for stream, appends in sample(version).items():
        for batch in appends:
            last = len(batch) - 1
            out.extend(Record(stream=stream, event=e, more=last - i) for i, e in enumerate(batch))
    return out


def write_fixtures(directory: Path) -> list[Path]:
    """Write this library's fixtures into ``directory``; refuses to overwrite one."""
    names = [directory / f"schema{SCHEMA_VERSION}.{kind}" for kind in ("jsonl", "msgpack", "sqlite")]
    if existing := [str(p) for p in names if p.exists()]:
        raise FileExistsError(f"fixtures are written once: {', '.join(existing)} exist")
    jsonl, packed, sqlite = names
    for url in (f"file:{jsonl}", f"sqlite:{sqlite}"):
        with open_store(url) as store:
            for stream, appends in sample(SCHEMA_VERSION).items():
                for batch in appends:
                    store.append(stream, batch)
    packed.write_bytes(msgpack_frames(events(SCHEMA_VERSION, "run")))
    return names


def main(argv: list[str]) -> Any:
    for path in write_fixtures(Path(argv[0] if argv else "tests/data")):
        sys.stdout.write(f"{path}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
