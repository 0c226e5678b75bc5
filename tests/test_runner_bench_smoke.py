"""The runner benchmark runs end to end (a quick pass: structure only, no timing asserted)."""

from __future__ import annotations

from bench import runner_bench


def test_the_runner_benchmark_reports_the_floor_then_a_table_of_ratios() -> None:
    report = runner_bench.run(quick=True)
    floor, rest = report.split("\n\n| variant |")
    assert floor.startswith("| driver, 1 ms model, one tool a step | baseline | steps per turn |")
    assert "| Runner.run_turn | hand-written loop | 20 |" in floor
    assert "| Runner.arun_turn | async hand-written loop | 20 |" in floor
    assert floor.count("at most 1.05x: ") == 2
    lines = ("| variant |" + rest).splitlines()
    assert lines[0].startswith("| variant | baseline | steps per turn | variant / baseline |")
    rows = [line for line in lines[2:] if line.startswith("|")]
    assert any(row.startswith("| Runner.run_turn | hand-written loop |") for row in rows)
    assert any(row.startswith("| Runner.arun_turn, async model and tool |") for row in rows)
    assert any(row.startswith("| Runner.run_turn, bare port |") for row in rows)
    assert all(row.split("|")[4].strip().endswith("x") for row in rows)


def test_every_variant_runs_the_same_turn() -> None:
    # The runner and the hand-written loop build the same transcript from the same model and tool.
    from nous_inbox.runner import LocalSession, Runner

    local = LocalSession()
    local.followup(runner_bench.PROMPT)
    list(Runner(runner_bench.make_model(3), [runner_bench.add]).run_turn(local))
    assert list(local.session.transcript) == runner_bench.hand_written(3)


def test_the_async_variants_run_the_same_turn() -> None:
    # The asyncio runner calls the same tool, by the same name, as the async hand-written loop.
    import asyncio

    from nous_inbox.runner import LocalSession

    async def turn() -> LocalSession:
        local = LocalSession()
        local.followup(runner_bench.PROMPT)
        async for _ in runner_bench.async_runner(3).arun_turn(local):
            pass
        return local

    local = asyncio.run(turn())
    assert list(local.session.transcript) == asyncio.run(runner_bench.ahand_written(3))


def test_the_bare_port_runs_the_same_turn_and_replays() -> None:
    from nous_inbox.runner import Runner
    from nous_inbox.session import replay

    port = runner_bench.BarePort()
    list(Runner(runner_bench.make_model(3), [runner_bench.add]).run_turn(port))
    assert list(port.session.transcript) == runner_bench.hand_written(3)
    assert replay(port.events) == port.session
