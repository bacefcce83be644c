"""RunQueue on the real bubblewrap backend: queue bounds, records, watchers, stdin, cancel."""

from __future__ import annotations

import asyncio

import pytest
from conftest import make_spec

from sandbox.backends.bwrap import BwrapBackend
from sandbox.errors import QueueFull, RunNotFound
from sandbox.run_queue import RunQueue


@pytest.fixture
async def service():
    svc = RunQueue(BwrapBackend(), max_running=1, max_queued=1, max_per_user=2)
    yield svc
    await svc.shutdown()


def sleeper(project, seconds: float = 30):
    return make_spec(project, ["python3", "-c", f"import time; print('up', flush=True); time.sleep({seconds})"], wall_seconds=40)


async def test_run_record_and_output(service, project):
    record = await service.submit("u1", "p1", make_spec(project, ["python3", "-c", "import sys; print('out'); print('err', file=sys.stderr)"]))
    assert record.status in ("queued", "running")
    done = (await service.wait(record.id)).public()
    assert done["status"] == "finished" and done["verdict"] == "ok"
    assert done["stdout"] == "out\n" and done["stderr"] == "err\n"
    assert done["wall_seconds"] > 0 and done["project_id"] == "p1"


async def test_queue_full_for_everyone_and_per_user(service, project):
    first = await service.submit("u1", "p1", sleeper(project))  # runs (one slot)
    await service.submit("u2", "p2", sleeper(project))  # waits (queue of one)
    with pytest.raises(QueueFull, match="the run queue is full"):
        await service.submit("u3", "p3", sleeper(project))
    service.max_queued = 10
    await service.submit("u1", "p1", sleeper(project))
    with pytest.raises(QueueFull, match="you already have 2 runs") as caught:
        await service.submit("u1", "p1", sleeper(project))
    assert caught.value.status_code == 429
    service.cancel(first.id)
    assert (await service.wait(first.id)).result.verdict.value == "cancelled"


async def test_cancel_before_start_never_runs(service, project):
    running = await service.submit("u1", "p1", sleeper(project))
    queued = await service.submit("u2", "p2", make_spec(project, ["python3", "-c", "open('ran', 'w')"]))
    service.cancel(queued.id)
    service.cancel(running.id)
    assert (await service.wait(queued.id)).public()["verdict"] == "cancelled"
    assert not (project / "ran").exists()


async def test_watchers_replay_and_follow_and_stdin_waits_for_start(service, project):
    blocker = await service.submit("u1", "p1", sleeper(project, 0.5))
    record = await service.submit("u2", "p2", make_spec(project, ["python3", "-c", "print('got', input())"]))
    await service.send_stdin(record.id, b"early\n")  # sent while queued
    await service.close_stdin(record.id)

    async def watch() -> bytes:
        return b"".join([c.data async for c in service.follow(record.id)])

    first, second = await asyncio.gather(watch(), watch())
    assert first == second == b"got early\n"
    assert await watch() == b"got early\n"  # a late watcher gets the replay
    await service.wait(blocker.id)


def test_unknown_run(service):
    with pytest.raises(RunNotFound) as caught:
        service.get("nope")
    assert caught.value.status_code == 404
