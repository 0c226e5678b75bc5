"""The page in a real browser: Debian's Chromium, headless, driven by Selenium against a real
``nous-inbox serve``. A person opens a session's page, types a steer while the scripted agent
works, and sees it land at the agent's next step. Its screenshot is the one the docs show. A team
sees the list of sessions with each one's state, live and filtered; a session's queued messages,
each with a withdraw; and what the model was shown at any of its requests.

Without Chromium, its driver or the web extra this test is skipped on a developer's machine and
fails in CI (``CI=true``): a browser test that silently did not run must not pass there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

if os.environ.get("CI") == "true":  # a missing web extra fails here, as a missing browser does
    import httpx  # noqa: F401
    import uvicorn  # noqa: F401
else:
    pytest.importorskip("uvicorn")
    pytest.importorskip("httpx")

from nous_inbox.cli.render import format_event
from nous_inbox.cli.style import Style
from nous_inbox.events import (
    SCHEMA_VERSION,
    Event,
    MailSent,
    MessageSent,
    ModelRequested,
    ToolCalled,
    Warned,
)
from nous_inbox.message import Message, ToolCall
from nous_inbox.session import replay
from nous_inbox.store import open_store
from tests import fixture_logs
from tests.helpers import wait_until
from tests.test_web_serve import ROOT, WAIT, Served, start_serve

#: Where the screenshot goes: the docs' picture is refreshed with
#: ``NOUS_INBOX_SCREENSHOT=docs/img/web-session.png pytest tests/test_web_page.py``; otherwise a
#: temporary file, so running the tests changes no tracked file.
SCREENSHOT_VARIABLE = "NOUS_INBOX_SCREENSHOT"


def _browser_parts() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        import selenium  # noqa: F401
    except ImportError:
        driver = None
    if chromium and driver:
        return chromium, driver
    why = "Chromium, chromium-driver and selenium are needed (apt-get install chromium chromium-driver; pip install selenium)"
    if os.environ.get("CI") == "true":
        pytest.fail(f"the browser test cannot run in CI: {why}")
    pytest.skip(why)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    chromium, driver_path = _browser_parts()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage", "--window-size=1200,1000",
                 f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    server = start_serve(f"sqlite:{tmp_path / 'log.sqlite'}", "--agent", "nous_inbox.web.scripted:agent",
                         env={"NOUS_INBOX_SCRIPTED_STEPS": "6",
                              "NOUS_INBOX_SCRIPTED_STEP_SECONDS": "0.6"})
    try:
        yield server
    finally:
        server.stop()


def lines(browser: Any) -> list[tuple[str, str]]:
    """(type, text) of each event line on the page, without a send's receipt mark or a
    request's view button, read at one moment (a live line goes as its reply is logged, so
    lines are not read one call each)."""
    return [(kind, text) for kind, text in browser.execute_script(
        "return Array.from(document.querySelectorAll('#events li'), (li) => {"
        " let text = li.innerText;"
        " for (const mark of li.querySelectorAll('.receipt, .actions')) {"
        "   if (text.endsWith(mark.innerText)) text = text.slice(0, text.length - mark.innerText.length);"
        "   text = text.trimEnd(); }"
        " return [li.dataset.type, text]; });")]


def receipt_marks(browser: Any) -> list[str]:
    """The receipt mark of each send on the page, in order."""
    from selenium.webdriver.common.by import By

    return [mark.text for mark in browser.find_elements(By.CSS_SELECTOR, "#events .receipt")]


def test_a_steer_typed_while_the_agent_works_lands_at_its_next_step(
        browser: Any, served: Served, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    token = served.url.rstrip("/")
    browser.get(f"{token}/sessions/incident-42#token=serve-test-token")
    assert "#token" not in browser.current_url  # the token left the address bar
    text = browser.find_element(By.ID, "text")
    text.send_keys("survey the logs from this morning's incident")
    browser.find_element(By.CSS_SELECTOR, "button[data-mode=prompt]").click()
    wait_until(lambda: any(kind == "tool_called" for kind, _ in lines(browser)),
        what="the agent works")

    steer = "the cdn.log matters most, read it next"
    text.send_keys(steer)
    browser.find_element(By.CSS_SELECTOR, "button[data-mode=steer]").click()
    wait_until(lambda: "steer stored as event #" in browser.find_element(By.ID, "sent").text,
        what="the steer was acknowledged")
    wait_until(lambda: any(kind == "turn_ended" for kind, _ in lines(browser)),
        what="the run ended")

    shown = lines(browser)
    sent_at = next(i for i, (kind, line) in enumerate(shown)
                   if kind == "message_sent" and "steer" in line and steer in line)
    claimed_at = next(i for i, (kind, line) in enumerate(shown)
                      if i > sent_at and kind == "queue_claimed" and "next_step" in line)
    requests = [i for i, (kind, _) in enumerate(shown) if kind == "model_requested"]
    assert any(i > claimed_at for i in requests)  # claimed right before the next model request
    replies = [line for kind, line in shown[claimed_at:] if kind == "model_replied"]
    assert f"Noted: '{steer}'" in replies[0]  # the agent's very next reply heard it
    assert 'read_log(name="cdn.log")' in replies[0]
    wait_until(lambda: "idle" in browser.find_element(By.ID, "status").text,
        what="the status says idle")
    # Each send is marked with where it went: the steer, delivered to turn 1's next step.
    wait_until(lambda: all("delivered: turn 1, step" in m for m in receipt_marks(browser)),
        what="both sends are marked delivered")

    screenshot = Path(os.environ.get(SCREENSHOT_VARIABLE) or tmp_path / "web-session.png")
    screenshot.parent.mkdir(parents=True, exist_ok=True)
    browser.execute_script(  # the picture shows the steer and the step it lands at
        "const list = document.getElementById('events');"
        "const line = list.children[arguments[0]];"
        "list.scrollTop = line.offsetTop - list.offsetTop - 80;", sent_at)
    assert not browser.find_element(By.ID, "token-form").is_displayed()
    assert browser.save_screenshot(str(screenshot))

    browser.get(token + "/")
    wait_until(lambda: "incident-42" in browser.find_element(By.ID, "sessions").text,
        what="the list shows the session")


def test_text_from_a_message_is_shown_as_text_never_as_markup(browser: Any, served: Served) -> None:
    from selenium.webdriver.common.by import By

    markup = '<img src=x onerror="document.title=\'owned\'"><b>bold</b>'
    with served.client() as client:
        assert client.post("/api/sessions/x/messages",
                           json={"mode": "inject", "text": markup}).status_code == 202
    browser.get(f"{served.url.rstrip('/')}/sessions/x#token=serve-test-token")
    line = wait_until(lambda: [text for kind, text in lines(browser) if kind == "message_sent"],
        what="the message is shown")
    assert markup in line[0]
    assert browser.find_elements(By.CSS_SELECTOR, "#events img, #events b") == []
    assert browser.title != "owned"


def test_without_the_token_the_page_asks_for_it(browser: Any, served: Served) -> None:
    from selenium.webdriver.common.by import By

    browser.get(served.url)
    form = wait_until(lambda: (f := browser.find_element(By.ID, "token-form")).is_displayed() and f,
        what="the token form is shown")
    form.find_element(By.ID, "token-input").send_keys("serve-test-token")
    form.find_element(By.TAG_NAME, "button").click()
    wait_until(lambda: browser.find_element(By.ID, "no-sessions").is_displayed(),
        what="with the token the (empty) list shows")


# -- every event type has its line -----------------------------------------------------------


def page_lines_table() -> set[str]:
    """The event types the page's table of lines names (``const LINES = {...}`` in page.js)."""
    source = (ROOT / "nous_inbox" / "web" / "static" / "page.js").read_text("utf-8")
    assert "const LINES = {" in source, "page.js keeps the line of each event type in LINES"
    table = source[source.index("const LINES = {"):]
    table = table[:table.index("\n};\n")]
    return set(re.findall(r"^  ([a-z_]+): \(e\) =>", table, re.MULTILINE))


def test_a_reply_shows_as_the_model_writes_it_and_the_logged_reply_replaces_it(
        browser: Any, tmp_path: Path) -> None:
    pytest.importorskip("pydantic_ai")
    from selenium.webdriver.common.by import By

    from tests.streaming_agent import FIRST, REST

    release = tmp_path / "release"
    server = start_serve(f"sqlite:{tmp_path / 'log.sqlite'}", "--agent",
                         "tests.streaming_agent:agent",
                         env={"NOUS_INBOX_TEST_RELEASE": str(release)})
    try:
        browser.get(f"{server.url.rstrip('/')}/sessions/live#token=serve-test-token")
        browser.find_element(By.ID, "text").send_keys("what happened this morning?")
        browser.find_element(By.CSS_SELECTOR, "button[data-mode=prompt]").click()
        live = wait_until(lambda: [text for kind, text in lines(browser) if kind == "text_delta"],
            what="the first words show while the model writes")
        assert FIRST.strip() in live[0]
        assert not any(kind == "model_replied" for kind, _ in lines(browser))  # not logged yet
        release.touch()  # the model writes the rest
        wait_until(lambda: any(kind == "turn_ended" for kind, _ in lines(browser)),
            what="the run ended")
        shown = lines(browser)
        assert not any(kind == "text_delta" for kind, _ in shown)  # the logged reply replaced it
        assert next(text for kind, text in shown if kind == "model_replied").endswith(FIRST + REST)
    finally:
        server.stop()


def test_the_page_has_a_line_for_every_event_type_of_the_vocabulary() -> None:
    vocabulary = {kind.__struct_config__.tag for kind in get_args(Event)}
    assert page_lines_table() == vocabulary


@pytest.fixture
def fixture_served(tmp_path: Path) -> Iterator[tuple[Served, str]]:
    """``serve`` over a copy of this version's fixture store, and its URL: its run and its
    mailbox hold every event type (``tests.fixture_logs``)."""
    store = tmp_path / "store.sqlite"
    shutil.copyfile(ROOT / "tests" / "data" / f"schema{SCHEMA_VERSION}.sqlite", store)
    server = start_serve(f"sqlite:{store}", "--agent", "nous_inbox.web.scripted:agent")
    try:
        yield server, f"sqlite:{store}"
    finally:
        server.stop()


def shows_as_log_prints(browser: Any, served: Served, stream: str, events: list[Event]) -> None:
    """The page of ``stream`` shows ``events``, each as the line ``nous-inbox log`` prints."""
    browser.get(f"{served.url.rstrip('/')}/sessions/{stream}#token=serve-test-token")
    shown = wait_until(lambda: (got := lines(browser)) and len(got) == len(events) and got,
        what=f"the {stream} events are shown")
    for event, (kind, text) in zip(events, shown, strict=True):
        assert kind == type(event).__struct_config__.tag
        # The page's line is the log's, with the time (hh:mm:ss and a space) after the seq.
        logged = format_event(event, Style(None, force=False), with_time=False)
        assert text[:7] + text[16:] == logged, (text, logged)


def test_every_event_type_shows_on_the_page_as_log_prints_it(
        browser: Any, fixture_served: tuple[Served, str]) -> None:
    served, _ = fixture_served
    for stream in ("run", "mailbox"):
        shows_as_log_prints(browser, served, stream, fixture_logs.events(SCHEMA_VERSION, stream))


def test_controls_and_bidi_overrides_show_escaped_as_log_prints_them(
        browser: Any, fixture_served: tuple[Served, str]) -> None:
    served, url = fixture_served
    hostile = "\x1b[2J\x9b31m \x7f\u202eevil\u2066 \u2028end\x1cx"
    call = ToolCall("c1", "read\u202e", {"path\x1b": [1, "é\u202e", {"a": None}], "n": 2})
    with open_store(url) as store:
        events = store.append("hostile", [
            MessageSent(target="next_step", wakeup=False, message=Message.user(hostile)),
            ToolCalled(turn=1, step=1, call=call),
            Warned(text=hostile),
            MailSent(id="m\u202e1", sender="lead\x1b", recipient="dev", body={"say": hostile}),
        ])
    shows_as_log_prints(browser, served, "hostile", events)
    assert not any(c in text for _, text in lines(browser) for c in "\x1b\x9b\x7f\u202e\u2066")


# -- the page for a team: the list, the queues, the model's view ----------------------------


PAGE_TOKEN = "#token=serve-test-token"


@pytest.fixture
def slow(tmp_path: Path) -> Iterator[tuple[Served, str]]:
    """``serve`` with the scripted agent taking its time (ten steps of half a second)."""
    url = f"sqlite:{tmp_path / 'log.sqlite'}"
    server = start_serve(url, "--agent", "nous_inbox.web.scripted:agent",
                         env={"NOUS_INBOX_SCRIPTED_STEPS": "10",
                              "NOUS_INBOX_SCRIPTED_STEP_SECONDS": "0.5"})
    try:
        yield server, url
    finally:
        server.stop()


def table(browser: Any) -> dict[str, list[str]]:
    """The list's rows, by session id: the cells after the id, read at one moment."""
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('#sessions tr'),"
        " (tr) => Array.from(tr.cells, (td) => td.innerText));")
    return {row[0]: row[1:] for row in rows}


def test_the_list_shows_each_session_s_state_live_and_filters_by_prefix(
        browser: Any, slow: tuple[Served, str]) -> None:
    served, url = slow
    with served.client() as client:
        assert client.post("/api/sessions/ops-quiet/messages",
                           json={"mode": "inject", "text": "fyi"}).status_code == 202
        assert client.post("/api/sessions/ops-busy/messages",
                           json={"mode": "prompt", "text": "survey the logs"}).status_code == 202
    with open_store(url) as store:  # another process's session: read by serve's scan
        store.append("dev-1", [MessageSent(target="next_turn", wakeup=False,
                                           message=Message.user("later"))] * 2)
    browser.get(f"{served.url.rstrip('/')}/{PAGE_TOKEN}")
    busy = wait_until(lambda: (row := table(browser).get("ops-busy")) and row[0] == "running" and row,
        what="the busy session shows running")
    assert busy[-1] == "here"
    wait_until(lambda: table(browser).get("ops-quiet", [""])[::3] == ["idle", "1"],
        what="the quiet session shows idle, its inject waiting for a step")
    wait_until(lambda: table(browser).get("dev-1") == ["idle", "0", "0", "0", "2", "not here"],
        what="the session written elsewhere shows what the scan read")
    wait_until(lambda: table(browser)["ops-busy"][0] == "idle",
        what="the list follows the run to its end, without a reload")

    browser.find_element("id", "filter").send_keys("ops-")
    wait_until(lambda: sorted(table(browser)) == ["ops-busy", "ops-quiet"],
        what="the filter keeps the sessions whose id starts with it")
    assert browser.find_element("id", "list-range").text == "1\u20132 of 2"


def queue(browser: Any, target: str) -> list[str]:
    """The entries shown on ``target``'s queue, read at one moment (the panel is redrawn as the
    session changes)."""
    return list(browser.execute_script(
        f"return Array.from(document.querySelectorAll('#queue-{target} li'), (li) => li.innerText);"))


def test_a_session_s_queued_messages_show_and_one_is_withdrawn_from_the_page(
        browser: Any, slow: tuple[Served, str]) -> None:
    served, _ = slow
    with served.client() as client:
        seqs = [client.post("/api/sessions/q/messages", json={"mode": "inject", "text": text})
                .json()["seq"] for text in ("the cdn is slow", "and the db")]
    browser.get(f"{served.url.rstrip('/')}/sessions/q{PAGE_TOKEN}")
    shown = wait_until(lambda: len(got := queue(browser, "next_step")) == 2 and got,
        what="both injects show on the next step's queue")
    assert shown[0].startswith(f"#{seqs[0]} the cdn is slow · wakes nothing")
    assert shown[1].startswith(f"#{seqs[1]} and the db · wakes nothing")
    assert browser.find_element("id", "count-next_step").text == "(2)"
    assert queue(browser, "next_turn") == []

    browser.execute_script(
        "document.querySelector('#queue-next_step li button.withdraw').click();")
    wait_until(lambda: [line.split(" ·")[0] for line in queue(browser, "next_step")]
               == [f"#{seqs[1]} and the db"], what="the withdrawn message left its queue")
    with served.client() as client:
        assert client.get(f"/api/sessions/q/messages/{seqs[0]}").json()["state"] == "withdrawn"


def test_each_model_request_shows_on_demand_what_the_model_was_shown(
        browser: Any, fixture_served: tuple[Served, str]) -> None:
    served, url = fixture_served
    with open_store(url) as store:
        requests = [e for e in store.read("run") if isinstance(e, ModelRequested)]
    browser.get(f"{served.url.rstrip('/')}/sessions/run{PAGE_TOKEN}")
    buttons = wait_until(
        lambda: len(found := browser.find_elements("css selector", "#events button.view"))
        >= len(requests) and found, what="each model request has its view button")
    for request, button in zip(requests, buttons, strict=False):
        button.click()
        title = f"What the model was shown at #{request.seq}: turn {request.turn}, step {request.step}"
        wait_until(lambda: browser.find_element("id", "view-title").text == title,  # noqa: B023
            what="the view of this request")
        with open_store(url) as store:  # the transcript only grows: its start is what was shown
            shown = replay(store.read("run")).transcript[:request.count]
        items = browser.find_elements("css selector", "#view-messages li")
        assert len(items) == request.count
        for item, message in zip(items, shown, strict=True):
            assert item.get_attribute("data-role") == message.role
            if message.content:
                assert item.find_element("css selector", ".content").text == message.content.strip()
    # The line's own text is still the log's: the button is no part of it.
    assert all(not text.endswith("view") for kind, text in lines(browser)
               if kind == "model_requested")
    browser.find_element("id", "view-close").click()
    assert not browser.find_element("id", "view").is_displayed()


def test_in_ci_a_missing_web_extra_fails_this_module_rather_than_skipping_it() -> None:
    script = (
        "import sys\n"
        "sys.modules['uvicorn'] = None  # as if the web extra were not installed\n"
        "import pytest\n"
        "sys.exit(pytest.main(['tests/test_web_page.py', '-q', '-p', 'no:cacheprovider',\n"
        "                      '-k', 'not missing_web_extra']))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"},
                            timeout=WAIT)
    assert result.returncode not in (0, 5), result.stdout[-2000:]
    assert "uvicorn" in result.stdout
