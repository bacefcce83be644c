"""A long run (the Shell) syncs what it writes back while it runs, each file once per change."""

from __future__ import annotations

import asyncio
import dataclasses

from conftest import make_spec

from sandbox.backends.bwrap import BwrapBackend


async def test_files_come_back_while_the_run_goes_on(project):
    script = "echo one > a.txt; sleep 1.5; echo two > b.txt; sleep 30"
    spec = dataclasses.replace(make_spec(project, ["sh", "-c", script], wall_seconds=60), sync_seconds=0.3)
    run = await BwrapBackend().start(spec)
    copies = []
    run.on_files_copied = lambda: copies.append(sorted(p.name for p in project.iterdir()))
    async with asyncio.timeout(20):
        while not (project / "b.txt").exists():
            await asyncio.sleep(0.1)
    assert (project / "a.txt").read_text() == "one\n" and (project / "b.txt").read_text() == "two\n"
    run.cancel()
    result = await run.result()
    assert copies == [["a.txt"], ["a.txt", "b.txt"]]  # once per change, not at every sync
    assert result.files_written == []  # everything had come back already
