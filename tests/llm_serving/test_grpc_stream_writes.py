"""gRPC's ModelStreamInfer writes each request's responses from that request's own task
(`context.write`, one write at a time), not through a queue that the handler, a generator, is woken
to drain: a piece goes out before its request's stream makes the next one."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from tritonclient.grpc import service_pb2 as pb

from llm_engine.entrypoints.kserve_grpc import InferenceServicer


class _Engine:
    @contextlib.contextmanager
    def admission(self) -> Iterator[None]:
        yield

    async def wait_for_burst(self) -> None:
        return None


class _Context:
    """Records writes; a write takes a loop pass and must not overlap another (grpc allows one)."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.writing = False

    async def write(self, response: pb.ModelStreamInferResponse) -> None:
        assert not self.writing, "two writes at once"
        self.writing = True
        await asyncio.sleep(0)
        self.events.append(f"wrote {response.error_message}")
        self.writing = False


def _servicer(events: list[str], pieces: int) -> InferenceServicer:
    servicer = InferenceServicer(lambda: None, None)  # type: ignore[arg-type]
    service = type("Service", (), {"engine": _Engine()})()

    async def admitted(context: Any) -> Any:
        return service

    async def stream_one(service: Any, request: pb.ModelInferRequest) -> AsyncIterator[pb.ModelStreamInferResponse]:
        for i in range(pieces):
            events.append(f"made {request.id}.{i}")
            yield pb.ModelStreamInferResponse(error_message=f"{request.id}.{i}")
            await asyncio.sleep(0)

    servicer._service = admitted  # type: ignore[method-assign]
    servicer._stream_one = stream_one  # type: ignore[method-assign]
    return servicer


async def _requests(*ids: str) -> AsyncIterator[pb.ModelInferRequest]:
    for request_id in ids:
        yield pb.ModelInferRequest(id=request_id)


def test_a_piece_is_written_before_its_request_makes_the_next() -> None:
    events: list[str] = []
    asyncio.run(_servicer(events, 3).ModelStreamInfer(_requests("a"), _Context(events)))
    assert events == ["made a.0", "wrote a.0", "made a.1", "wrote a.1", "made a.2", "wrote a.2"]


def test_requests_on_one_stream_run_together_and_their_writes_take_turns() -> None:
    events: list[str] = []
    asyncio.run(_servicer(events, 4).ModelStreamInfer(_requests("a", "b"), _Context(events)))
    written = [e.removeprefix("wrote ") for e in events if e.startswith("wrote")]
    assert sorted(written) == [f"{r}.{i}" for r in "ab" for i in range(4)]
    assert [w for w in written if w.startswith("a")] == [f"a.{i}" for i in range(4)]
    assert [w for w in written if w.startswith("b")] == [f"b.{i}" for i in range(4)]
    first_b = written.index("b.0")
    assert first_b < written.index("a.3"), "b's pieces waited for a's whole stream"


def test_a_cancelled_stream_cancels_its_requests() -> None:
    events: list[str] = []
    started = asyncio.Event()

    async def never_ending(service: Any, request: pb.ModelInferRequest) -> AsyncIterator[pb.ModelStreamInferResponse]:
        try:
            started.set()
            await asyncio.sleep(3600)
            yield pb.ModelStreamInferResponse()
        finally:
            events.append("closed")

    async def run() -> None:
        servicer = _servicer(events, 0)
        servicer._stream_one = never_ending  # type: ignore[method-assign]
        call = asyncio.ensure_future(servicer.ModelStreamInfer(_requests("a"), _Context(events)))
        await started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    asyncio.run(run())
    assert events == ["closed"]
