"""The terminal pane's shell: bash on a PTY in the project's sandbox, spoken over a WebSocket.

Frames: client -> {"type": "input", "data": str} | {"type": "resize", "rows": n, "cols": n};
server -> {"type": "output", "data": str} ... then {"type": "exit", "verdict": ...}. Closing the
socket ends the shell (and everything it started); files it writes come back to the project every
few seconds and as it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import anyio
from starlette.websockets import WebSocket

from sandbox.backend import Backend, Mount, RunSpec, SandboxRun
from sandbox.frames import SOCKET_GONE, receive_frame, send_chunks
from sandbox.limits import MIB, Limits

SHELL_ARGV = ["bash", "-i"]
SYNC_SECONDS = 2.0  # files the Shell writes reach the project (and every open tree) this often
SHELL_LIMITS = Limits(cpu_seconds=600, wall_seconds=4 * 3600, memory_bytes=512 * MIB, pids=128,
                      output_bytes=64 * MIB, file_bytes=64 * MIB, open_files=1024, disk_bytes=256 * MIB,
                      files_count=10000)


async def _read_input(websocket: WebSocket, run: SandboxRun) -> None:
    """Feed keystrokes and resizes to the shell until the client goes away (WebSocketDisconnect)."""
    while True:
        try:
            frame = await receive_frame(websocket)
            if frame["type"] == "input" and isinstance(frame.get("data"), str):
                await run.send_stdin(frame["data"].encode())
            elif frame["type"] == "resize":
                rows, cols = frame.get("rows"), frame.get("cols")
                if not (isinstance(rows, int) and isinstance(cols, int)):
                    raise ValueError("resize: rows and cols must be integers")
                await run.resize(rows, cols)
            else:
                raise ValueError('frames are {"type": "input", "data": ...} or {"type": "resize", "rows": ..., "cols": ...}')
        except ValueError as exc:
            await websocket.send_json({"type": "error", "message": str(exc)})


async def serve_shell(websocket: WebSocket, backend: Backend, project_dir: Path, rows: int, cols: int,
                      env: dict[str, str] | None = None, mounts: tuple[Mount, ...] = (),
                      on_files: Callable[[], None] = lambda: None) -> None:
    """Run a shell for this socket until it exits or the client leaves; files it writes are copied back every
    SYNC_SECONDS (then on_files is called) and as it ends. env and mounts: the project's package environments."""
    run = await backend.start(RunSpec(SHELL_ARGV, project_dir, SHELL_LIMITS, env or {}, terminal=(rows, cols), mounts=mounts,
                                      sync_seconds=SYNC_SECONDS))
    run.on_files_copied = on_files
    exited = False
    try:
        async with anyio.create_task_group() as tasks:
            async def pump() -> None:
                nonlocal exited
                with suppress(*SOCKET_GONE):
                    await send_chunks(websocket, run.chunks(), "output")
                    exited = True
                tasks.cancel_scope.cancel()

            async def read() -> None:
                with suppress(*SOCKET_GONE):
                    await _read_input(websocket, run)
                tasks.cancel_scope.cancel()

            tasks.start_soon(pump)
            tasks.start_soon(read)
    finally:
        run.cancel()  # no-op once the shell has exited; else it ends the shell and all it started
        with anyio.CancelScope(shield=True):
            result = await run.result()
    if exited:
        with suppress(*SOCKET_GONE):
            await websocket.send_json({"type": "exit", "verdict": result.verdict.value, "exit_code": result.exit_code})
            await websocket.close(1000)
