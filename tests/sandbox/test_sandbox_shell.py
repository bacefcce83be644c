"""An interactive shell on a terminal in the project's sandbox (the terminal pane's primitive)."""

from __future__ import annotations

import asyncio

import pytest
from conftest import make_spec

from sandbox.backend import RunSpec
from sandbox.verdict import Verdict


async def read_until(chunks, marker: bytes, seen: bytearray) -> None:
    while marker not in seen:
        seen += (await asyncio.wait_for(chunks.__anext__(), 10)).data


async def test_shell_on_a_terminal(backend, project):
    spec = RunSpec(["bash", "--norc", "-i"], project, make_spec(project, ["x"], wall_seconds=30).limits, terminal=(40, 120))
    shell = await backend.start(spec)
    chunks, seen = shell.chunks(), bytearray()
    await read_until(chunks, b"$ ", seen)  # type at the prompt, as a person does
    await shell.send_stdin(b"echo $((6*7)) > answer.txt; stty size; tty; echo D''ONE\n")
    await read_until(chunks, b"DONE", seen)
    assert b"40 120" in seen
    with pytest.raises(ValueError, match="between 1 and 1000"):
        await shell.resize(0, 5)
    await shell.resize(50, 132)
    await shell.send_stdin(b"stty size; exit\n")
    async for chunk in chunks:
        seen += chunk.data
    result = await shell.result()
    assert result.verdict == Verdict.OK, result
    assert b"50 132" in seen and b"not a tty" not in seen and b"no job control" not in seen
    assert (project / "answer.txt").read_text() == "42\n"


async def test_resize_needs_a_terminal(backend, project):
    run = await backend.start(make_spec(project, ["sh", "-c", "echo up; sleep 5"]))
    with pytest.raises(ValueError, match="no terminal"):
        await run.resize(40, 120)
    run.cancel()
    assert (await run.result()).verdict == Verdict.CANCELLED


def test_terminal_input_and_output_under_uvloop():
    """`codeyard serve` runs on uvloop, whose write-pipe transport reads from a PTY master and failed."""
    import uvloop

    from sandbox.process import HostProcess

    class Collect:
        def __init__(self) -> None:
            self.data = b""

        def emit(self, stream: str, data: bytes) -> None:
            self.data += data

    async def session() -> bytes:
        out = Collect()
        proc = await HostProcess.spawn_terminal(["bash", "--norc", "-i"], out, {"PATH": "/usr/bin:/bin", "TERM": "dumb"},
                                                "/tmp", size=(24, 80))
        await proc.write_stdin(b"echo $((6*7))-answer\rexit\r")
        status, _ = await asyncio.wait_for(proc.wait(), 20)
        assert status == 0
        return out.data

    assert b"42-answer" in uvloop.run(session())
