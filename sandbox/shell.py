"""The terminal pane's shell: bash on a PTY in the project's sandbox, spoken over a WebSocket.

Frames: client -> {"type": "input", "data": str} | {"type": "resize", "rows": n, "cols": n};
server -> {"type": "output", "data": str} ... then {"type": "exit", "verdict": ...}. Closing the
socket ends the shell (and everything it started); files it wrote come back to the project.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from starlette.websockets import WebSocket, WebSocketDisconnect

from sandbox.backend import Backend, RunSpec, SandboxRun
from sandbox.frames import receive_frame, send_chunks
from sandbox.limits import MIB, Limits

SHELL_ARGV = ["bash", "-i"]
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


async def serve_shell(websocket: WebSocket, backend: Backend, project_dir: Path, rows: int, cols: int) -> list[str]:
    """Run a shell for this socket until it exits or the client leaves; returns the files it wrote."""
    run = await backend.start(RunSpec(SHELL_ARGV, project_dir, SHELL_LIMITS, terminal=(rows, cols)))
    output = asyncio.create_task(send_chunks(websocket, run.chunks(), "output"))
    reader = asyncio.create_task(_read_input(websocket, run))
    try:
        await asyncio.wait({output, reader}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        client_left = reader.done()
        run.cancel()  # no-op once the shell has exited
        reader.cancel()
        result = await run.result()
        await asyncio.gather(output, reader, return_exceptions=True)
    if not client_left:
        try:
            await websocket.send_json({"type": "exit", "verdict": result.verdict.value, "exit_code": result.exit_code})
            await websocket.close(1000)
        except (WebSocketDisconnect, RuntimeError):
            pass
    return result.files_written
