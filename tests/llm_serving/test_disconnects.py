"""unless_disconnected: the work runs in the request's own task (no task per request on the path from
the engine's outputs to the response); a client that leaves while it waits cancels the work (its
generators close, which aborts the engine's requests) and gets 499 with its task not cancelled; a
cancel from elsewhere still cancels; one watching task serves every waiting request and ends."""

from __future__ import annotations

import asyncio

import pytest
from starlette.requests import Request

from llm_engine.entrypoints import disconnects
from llm_engine.entrypoints.disconnects import unless_disconnected


class Client:
    """A request whose body was read: its `receive` waits until the client disconnects."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.request = Request({"type": "http", "method": "POST", "headers": []}, self.receive)

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}


@pytest.fixture(autouse=True)
def quick_poll(monkeypatch):
    monkeypatch.setattr(disconnects, "POLL_S", 0.02)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_work_runs_in_the_callers_task_and_its_result_is_returned():
    async def main() -> None:
        caller = asyncio.current_task()

        async def work() -> asyncio.Task | None:
            await asyncio.sleep(0)
            return asyncio.current_task()

        assert await unless_disconnected(Client().request, work()) is caller

    run(main())


def test_client_leaving_while_waiting_cancels_the_work_and_answers_499():
    async def main() -> None:
        client, closed, started = Client(), asyncio.Event(), asyncio.Event()

        async def work() -> str:
            try:
                started.set()
                await asyncio.Event().wait()  # queued in the engine
                return "never"
            finally:
                closed.set()

        call = asyncio.ensure_future(unless_disconnected(client.request, work()))
        await started.wait()
        await asyncio.sleep(0.05)
        assert not call.done()
        client.gone.set()
        response = await call
        assert response.status_code == 499 and closed.is_set()
        assert not call.cancelled() and call.cancelling() == 0
        await asyncio.sleep(0.05)
        # the watching task ended with nothing left to watch (other tests' loops may have left theirs)
        assert asyncio.get_running_loop() not in disconnects._WATCHES

    run(main())


def test_a_cancel_from_elsewhere_still_cancels():
    async def main() -> None:
        started = asyncio.Event()

        async def work() -> None:
            started.set()
            await asyncio.Event().wait()

        call = asyncio.ensure_future(unless_disconnected(Client().request, work()))
        await started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    run(main())


def test_one_watching_task_for_a_burst_and_only_the_leaver_is_cancelled():
    async def main() -> None:
        clients = [Client() for _ in range(12)]
        release = asyncio.Event()

        async def work(i: int) -> int:
            await release.wait()
            return i

        before = len(asyncio.all_tasks())
        calls = [asyncio.ensure_future(unless_disconnected(c.request, work(i))) for i, c in enumerate(clients)]
        await asyncio.sleep(0)
        assert len(asyncio.all_tasks()) - before == len(calls) + 1  # the calls and one watch
        clients[3].gone.set()
        await asyncio.sleep(0.08)
        assert calls[3].done() and calls[3].result().status_code == 499
        release.set()
        assert [await c for i, c in enumerate(calls) if i != 3] == [i for i in range(12) if i != 3]

    run(main())
