"""EventStream, the servers' SSE response: every event then the end of the body; a client that
disconnects stops the stream (closing its generator, which aborts the engine's requests) and the
request's task carries on uncancelled; a cancel from elsewhere (the server stopping) still cancels."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from llm_engine.entrypoints.api import EventStream


class Client:
    """An ASGI client whose body was read: `receive` waits until it disconnects."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.gone = asyncio.Event()

    async def receive(self) -> dict:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)

    def bodies(self) -> list[bytes]:
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]


class Events:
    def __init__(self, count: int, then_wait: bool = False) -> None:
        self.count, self.then_wait = count, then_wait
        self.closed = False
        self.waiting = asyncio.Event()

    async def __call__(self) -> AsyncIterator[bytes]:
        try:
            for i in range(self.count):
                yield b"data: %d\n\n" % i
            if self.then_wait:  # an engine stream waiting for its next step
                self.waiting.set()
                await asyncio.Event().wait()
        finally:
            self.closed = True


SCOPE = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}


def test_every_event_is_sent_then_the_body_ends():
    async def run() -> tuple[Client, Events]:
        client, events = Client(), Events(3)
        await EventStream(events())(SCOPE, client.receive, client.send)
        return client, events

    client, events = asyncio.run(run())
    assert client.sent[0]["type"] == "http.response.start" and client.sent[0]["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in client.sent[0]["headers"]
    assert client.bodies() == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert client.sent[-1]["more_body"] is False and events.closed


def test_a_client_that_disconnects_stops_the_stream_and_the_task_goes_on():
    async def run() -> tuple[Client, Events, int]:
        client, events = Client(), Events(2, then_wait=True)
        call = asyncio.ensure_future(EventStream(events())(SCOPE, client.receive, client.send))
        await events.waiting.wait()
        client.gone.set()
        await asyncio.wait_for(asyncio.shield(call), 5)  # returns: the disconnect is no error
        return client, events, call.cancelling()

    client, events, cancelling = asyncio.run(run())
    assert client.bodies() == [b"data: 0\n\n", b"data: 1\n\n"]  # no end of body: the client has gone
    assert events.closed and cancelling == 0


def test_a_cancel_from_elsewhere_still_cancels():
    async def run() -> Events:
        client, events = Client(), Events(1, then_wait=True)
        call = asyncio.ensure_future(EventStream(events())(SCOPE, client.receive, client.send))
        await events.waiting.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        return events

    assert asyncio.run(run()).closed
