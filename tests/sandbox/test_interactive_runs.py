"""Interactive runs: the wall clock stands still while the program waits for input, and only then."""

from __future__ import annotations

import asyncio
import dataclasses

from conftest import make_spec

from sandbox.backends.bwrap import BwrapBackend
from sandbox.run_queue import RunQueue
from sandbox.verdict import Verdict

WALL = 1.5  # the strict wall limit here; each program below waits for input longer than that


def interactive(project, argv, wait: float = 60):
    return dataclasses.replace(make_spec(project, argv, wall_seconds=WALL), input_wait_seconds=wait)


async def answer_after(run, pause: float, data: bytes | None, close: bool = True) -> list[bool]:
    """Wait `pause` seconds, noting whether the run said it waits for input, then type data (and Ctrl+D)."""
    seen = []
    run.on_change = lambda: seen.append(run.waiting_for_input)
    await asyncio.sleep(pause)
    if data:
        await run.send_stdin(data)
    if close:
        await run.close_stdin()
    return seen


async def test_a_pause_at_input_is_not_counted(backend, project):
    (project / "main.py").write_text("name = input('name? ')\nprint('hi', name)\n")
    run = await backend.start(interactive(project, ["python3", "main.py"]))
    seen = await answer_after(run, WALL + 2, b"ada\n", close=False)
    result = await run.result()
    assert (result.verdict, result.stdout) == (Verdict.OK, b"name? hi ada\n"), result
    assert seen[:1] == [True] and result.wall_seconds > WALL


async def test_strict_runs_keep_their_wall_limit(project):
    (project / "main.py").write_text("input()\n")
    run = await BwrapBackend().start(make_spec(project, ["python3", "main.py"], wall_seconds=WALL))
    result = await run.result()
    assert result.verdict == Verdict.TIME_LIMIT and not run.waiting_for_input


async def test_sleeping_is_not_waiting_for_input(project):
    (project / "main.py").write_text("import time\ntime.sleep(30)\n")
    result = await (await BwrapBackend().start(interactive(project, ["python3", "main.py"]))).result()
    assert result.verdict == Verdict.TIME_LIMIT and result.wall_seconds < WALL + 1


async def test_node_readline_waits_then_ends_on_eof(project):
    (project / "index.js").write_text(
        "const rl = require('readline').createInterface({ input: process.stdin });\n"
        "rl.on('line', (line) => console.log('got ' + line));\nrl.on('close', () => console.log('bye'));\n")
    run = await BwrapBackend().start(interactive(project, ["node", "index.js"]))
    await answer_after(run, WALL + 2, b"one\n")  # then Ctrl+D: readline closes, Node exits
    result = await run.result()
    assert (result.verdict, result.stdout) == (Verdict.OK, b"got one\nbye\n"), result


async def test_one_wait_is_capped(project):
    (project / "main.py").write_text("input()\n")
    result = await (await BwrapBackend().start(interactive(project, ["python3", "main.py"], wait=2))).result()
    assert result.verdict == Verdict.TIME_LIMIT and "no input for 2 s" in result.message


async def test_a_thread_at_input_does_not_pause_the_clock_for_a_busy_one(project):
    (project / "main.py").write_text("import threading\nthreading.Thread(target=input, daemon=True).start()\nwhile True:\n    pass\n")
    result = await (await BwrapBackend().start(interactive(project, ["python3", "main.py"]))).result()
    assert result.verdict == Verdict.TIME_LIMIT and result.wall_seconds < WALL + 1.5, result


async def test_a_run_waiting_for_input_lends_its_slot(project):
    (project / "main.py").write_text("print('hi', input())\n")
    (project / "quick.py").write_text("print('quick')\n")
    service = RunQueue(BwrapBackend(), max_running=1)
    thinking = await service.submit("ada", "p", interactive(project, ["python3", "main.py"]))
    quick = await service.submit("bob", "p", make_spec(project, ["python3", "quick.py"]))
    async with asyncio.timeout(20):  # bob's run goes while ada's waits for input, in the only slot
        assert (await service.wait(quick.id)).result.stdout == b"quick\n"
    assert thinking.status == "running" and thinking.waiting_for_input
    await service.send_stdin(thinking.id, b"ada\n")
    assert (await service.wait(thinking.id)).result.stdout == b"hi ada\n"
    assert not service._running and not service._lent  # every slot given back
