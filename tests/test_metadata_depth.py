"""One depth limit for nested JSON trees: what a message accepts, every store and ``show --json`` read back."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from nous_inbox.__main__ import main
from nous_inbox.events import MessageSent
from nous_inbox.frozen import MAX_DEPTH
from nous_inbox.message import Message, ToolCall
from nous_inbox.store import Store, open_store


def nested(depth: int) -> dict[str, Any]:
    """A mapping ``depth`` containers deep (the outermost counted), alternating dicts and lists."""
    value: Any = "leaf"
    for level in range(depth - 1):
        value = [value] if level % 2 else {"k": value}
    return {"k": value}


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    return 0


def test_the_helper_builds_what_it_says() -> None:
    assert depth_of(nested(1)) == 1 and depth_of(nested(MAX_DEPTH)) == MAX_DEPTH


def test_metadata_at_the_limit_is_accepted() -> None:
    message = Message.user("deep", metadata=nested(MAX_DEPTH))
    assert message.metadata == nested(MAX_DEPTH)


def test_metadata_one_past_the_limit_is_refused_naming_the_path() -> None:
    with pytest.raises(ValueError, match=r"^Message\.metadata\['k'\]\[0\]\['k'\].*: nested 65 "
                       r"containers deep, deeper than the limit of 64"):
        Message.user("deep", metadata=nested(MAX_DEPTH + 1))


def test_tool_call_arguments_have_the_same_limit() -> None:
    assert ToolCall("c1", "f", nested(MAX_DEPTH)).arguments == nested(MAX_DEPTH)
    with pytest.raises(ValueError, match=r"^ToolCall\.arguments\[.*nested 65 containers deep"):
        ToolCall("c1", "f", nested(MAX_DEPTH + 1))
    with pytest.raises(ValueError, match=r"^Message\.tool_calls\[0\]: ToolCall\.arguments"):
        Message.assistant(tool_calls=[{"id": "c1", "name": "f", "arguments": nested(65)}])


def test_a_limit_far_below_what_the_decoders_handle() -> None:
    # msgspec and json stop near the recursion limit (about 1000, less on a deep stack).
    assert MAX_DEPTH * 8 <= 1000


def test_every_store_reads_back_metadata_at_the_limit(store: Store) -> None:
    message = Message.user("deep", metadata=nested(MAX_DEPTH))
    store.append("s", [MessageSent(target="next_step", wakeup=True, message=message)])
    store.append("other", [MessageSent(target="next_step", wakeup=False, message=Message.user("x"))])
    (event,) = list(store.read("s"))
    assert isinstance(event, MessageSent) and event.message == message
    assert [e.message.content for e in store.read("other")] == ["x"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("scheme", ["file", "sqlite"])
def test_every_store_reopened_reads_back_metadata_at_the_limit(scheme: str, tmp_path: Path) -> None:
    url = f"{scheme}:{tmp_path / 'store'}"
    message = Message.user("deep", metadata=nested(MAX_DEPTH))
    with open_store(url) as store:
        store.append("s", [MessageSent(target="next_step", wakeup=True, message=message)])
    with open_store(url, read_only=True) as store:
        (event,) = list(store.read("s"))
    assert event.message == message  # type: ignore[attr-defined]


def test_show_and_log_json_print_metadata_at_the_limit(kind: str, url: str) -> None:
    if kind == "memory":
        pytest.skip("a memory: store lives in one process; the command line cannot reach it")
    message = Message.user("deep", metadata=nested(MAX_DEPTH))
    with open_store(url) as store:
        store.append("s", [MessageSent(target="next_step", wakeup=True, message=message)])
    out = io.StringIO()
    assert main(["show", "--store", url, "s", "--json"], out=out) == 0
    assert json.loads(out.getvalue())["next_step"][0]["metadata"] == nested(MAX_DEPTH)
    out = io.StringIO()
    assert main(["log", "--store", url, "s", "--json"], out=out) == 0
    assert json.loads(out.getvalue())["message"]["metadata"] == nested(MAX_DEPTH)
