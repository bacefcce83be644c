"""HostProcess under uvloop (what `codeyard serve` runs on) closes each descriptor it owns once.

uvloop's pipe transports close their descriptor twice (libuv and the file object each close the
same number); under load a thread that opened a file between the two closes lost it, and a git
checkpoint failed with EBADF. Racing threads makes a flaky test, but the second close is always
visible on its own: in a process that opens nothing else it fails with EBADF, which strace shows.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from sandbox.process import _FdWriter

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import asyncio, uvloop
from sandbox.backend import SandboxRun
from sandbox.limits import Limits
from sandbox.process import HostProcess

async def main():
    for _ in range(5):
        run = SandboxRun(Limits())
        proc = await HostProcess.spawn(["/bin/echo", "hi"], run, {"PATH": "/usr/bin:/bin"}, "/")
        await proc.write_stdin(b"input nobody reads")
        await proc.close_stdin()
        await proc.wait()
        assert bytes(run._out["stdout"]) == b"hi\\n", run._out
    for _ in range(3):
        run = SandboxRun(Limits())
        proc = await HostProcess.spawn_terminal(["/bin/cat"], run, {"PATH": "/usr/bin:/bin"}, "/", size=(24, 80))
        await proc.write_stdin(b"typed\\n")
        await asyncio.sleep(0.1)
        proc.kill()
        await proc.wait()
        assert b"typed" in bytes(run._out["stdout"]), run._out

with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
    runner.run(main())
print("done")
"""


def test_no_descriptor_is_closed_twice() -> None:
    # Without -f strace follows the event loop's thread only, not the children (whose start-up
    # closes descriptors by number on purpose).
    traced = subprocess.run(["strace", "-qq", "-e", "trace=close", "-Z", sys.executable, "-c", SCRIPT],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert traced.returncode == 0, traced.stderr
    assert traced.stdout.strip() == "done"
    failed_closes = [line for line in traced.stderr.splitlines() if "EBADF" in line]
    assert failed_closes == []


async def test_a_writer_closed_after_an_empty_or_unsent_write_leaves_nothing_watched() -> None:
    """An empty stdin (`"stdin": ""`) registered the writer and closed the descriptor under it: the
    next descriptor with that number (a run's pidfd) then failed to register (FileNotFoundError)."""
    loop = asyncio.get_running_loop()
    for data, finish in ((b"", "close"), (b"x" * (1 << 20), "abort"), (b"y", "close")):
        read_end, write_end = os.pipe()
        writer = _FdWriter(loop, write_end)
        writer.write(data)
        getattr(writer, finish)()
        if finish == "close" and data:
            await asyncio.sleep(0.05)  # delivered, then closed
            assert os.read(read_end, 10) == data
        again_read, again_write = os.pipe()  # takes the lowest free numbers: the writer's one
        ready = loop.create_future()
        loop.add_reader(again_read, lambda: ready.done() or ready.set_result(None))
        os.write(again_write, b"!")
        await asyncio.wait_for(ready, 5)
        loop.remove_reader(again_read)
        for fd in (read_end, again_read, again_write):
            os.close(fd)
