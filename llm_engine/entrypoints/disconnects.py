"""Waiting for a request's result unless its client goes away, with one watching task per event loop.

`unless_disconnected` used to run each request's work in a task of its own, awaited with a timeout
so that it could look for a disconnect between waits. In a burst that put two tasks on the path
from the engine's first outputs to each response: the event loop ran all twelve work tasks, then
all twelve requests' tasks, before the first response's headers went out. Here the work runs in
the request's own task, and one task per event loop looks every `POLL_S` at the requests that
have waited that long, cancelling the task of any whose client has gone (which closes the work's
generators, so its engine requests are aborted) and answering 499 for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Final, TypeVar

from starlette.requests import Request
from starlette.responses import Response

POLL_S: Final = 0.25
Result = TypeVar("Result")


class _Waiter:
    """A request's task waiting in `unless_disconnected`."""

    __slots__ = ("task", "request", "since", "gone")

    def __init__(self, task: asyncio.Task[object], request: Request) -> None:
        self.task, self.request, self.since, self.gone = task, request, time.monotonic(), False


class _Watch:
    """The waiters of one event loop and the task that looks at them; it ends when none is left."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.waiters: set[_Waiter] = set()
        self.task: asyncio.Task[None] | None = None

    def add(self, waiter: _Waiter) -> None:
        self.waiters.add(waiter)
        if self.task is None:
            self.task = self.loop.create_task(self._run(), name="codeyard-disconnect-watch")

    async def _run(self) -> None:
        try:
            while self.waiters:
                await asyncio.sleep(POLL_S)
                due = time.monotonic() - POLL_S
                for waiter in [w for w in self.waiters if w.since <= due]:
                    # still waiting (not left while an earlier one was looked at) and its client gone
                    if await waiter.request.is_disconnected() and waiter in self.waiters:
                        waiter.gone = True
                        self.waiters.discard(waiter)
                        waiter.task.cancel()
        finally:
            self.task = None
            if _WATCHES.get(self.loop) is self:
                del _WATCHES[self.loop]


_WATCHES: dict[asyncio.AbstractEventLoop, _Watch] = {}  # entries leave with their watching task


async def unless_disconnected(request: Request, work: Awaitable[Result]) -> Result | Response:
    """Await `work` in the caller's task, cancelling it (which aborts its engine requests) if the
    client goes away meanwhile; then the answer is a 499 response and the caller is not cancelled.
    A cancel from elsewhere (the server stopping) goes through as before.

    A stream is watched here until its first output (while it waits in the queue), then by
    EventStream, which cancels the stream when the client disconnects.
    """
    task = asyncio.current_task()
    assert task is not None, "unless_disconnected runs in a task"
    loop = asyncio.get_running_loop()
    watch = _WATCHES.get(loop)
    if watch is None:
        watch = _WATCHES[loop] = _Watch(loop)
    waiter = _Waiter(task, request)
    watch.add(waiter)
    try:
        return await work
    except asyncio.CancelledError:
        if not waiter.gone:
            raise
        task.uncancel()
        return Response(status_code=499)
    finally:
        watch.waiters.discard(waiter)
