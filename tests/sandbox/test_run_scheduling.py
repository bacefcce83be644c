"""Fair run slots (issue 14, defect 5): a user who keeps resubmitting holds neither every slot nor the
head of the queue, and queued runs know their place."""

from __future__ import annotations

import asyncio

from conftest import make_spec

from sandbox import run_queue as queue_module
from sandbox.backends.bwrap import BwrapBackend
from sandbox.run_queue import RunQueue, RunState

RUN_SECONDS = 1.5  # how long each of user A's runs sleeps


def sleeper(project, seconds: float):
    return make_spec(project, ["python3", "-c", f"import time; time.sleep({seconds})"], wall_seconds=seconds + 10)


async def test_a_newcomer_starts_within_one_slot_turnover_while_another_user_resubmits(project):
    """A keeps four runs waiting or running (resubmitting as each ends) on a server with two slots;
    B's print(1) takes the first slot that frees, not the one after A's queued runs."""
    service = RunQueue(BwrapBackend(), max_running=2, max_per_user=4)
    stop = asyncio.Event()

    async def lane() -> None:
        while not stop.is_set():
            record = await service.submit("A", "pa", sleeper(project, RUN_SECONDS))
            await service.wait(record.id)

    lanes = [asyncio.create_task(lane()) for _ in range(4)]
    try:
        while len(holders := [t.record for t in service._records.values() if t.record.status == "running"]) < 2:
            await asyncio.sleep(0.01)
        newcomer = await service.submit("B", "pb", make_spec(project, ["python3", "-c", "print(1)"]))
        done = await asyncio.wait_for(service.wait(newcomer.id), RUN_SECONDS * 6)
    finally:
        stop.set()
        await asyncio.gather(*lanes)
        await service.shutdown()
    wait = done.started_at - done.created_at
    turnover = max(r.finished_at - r.started_at for r in holders)  # a slot's: the run, its start and clean-up
    bound = turnover + RUN_SECONDS / 2  # FIFO behind A's queued runs took two turnovers
    print(f"\nB's print(1) waited {wait:.2f} s for a slot (A's runs sleep {RUN_SECONDS} s and held their slot "
          f"{turnover:.2f} s; bound {bound:.2f} s)")
    assert done.result.verdict.value == "ok" and done.public()["stdout"] == "1\n"
    assert wait <= bound


async def test_one_user_never_runs_more_than_their_share(project):
    service = RunQueue(BwrapBackend(), max_running=3, max_running_per_user=2)
    try:
        records = [await service.submit("A", "pa", sleeper(project, 30)) for _ in range(3)]
        assert [r.status for r in records] == ["running", "running", "queued"]
        other = await service.submit("B", "pb", sleeper(project, 30))
        assert other.status == "running"  # the third slot was free all along, but not for A
    finally:
        await service.shutdown()


async def test_queue_positions_round_robin_between_users_and_follow_changes(project):
    service = RunQueue(BwrapBackend(), max_running=1)
    try:
        a1, a2, a3 = [await service.submit("A", "pa", sleeper(project, 30)) for _ in range(3)]
        b1 = await service.submit("B", "pb", sleeper(project, 30))
        assert (a1.status, a1.queue_position) == ("running", None)
        assert [r.queue_position for r in (b1, a2, a3)] == [1, 2, 3]  # A had a turn: B, not yet served, is next
        x1 = await service.submit("X", "px", sleeper(project, 30))
        assert [r.queue_position for r in (b1, x1, a2, a3)] == [1, 2, 3, 4]
        assert x1.public()["queue_position"] == 2

        updates = service.updates(x1.id)
        assert await anext(updates) == RunState("queued", 2)
        service.cancel(b1.id)
        assert await anext(updates) == RunState("queued", 1)
        assert [r.queue_position for r in (a2, a3)] == [2, 3]
        service.cancel(a1.id)  # the slot frees: X's turn
        assert await asyncio.wait_for(anext(updates), 10) == RunState("running", None)
        assert [r.queue_position for r in (a2, a3)] == [1, 2]
        await updates.aclose()
    finally:
        await service.shutdown()


async def test_turns_of_idle_users_are_forgotten_beyond_a_bound(project, monkeypatch):
    monkeypatch.setattr(queue_module, "REMEMBERED_TURNS", 1)
    service = RunQueue(BwrapBackend(), max_running=1)
    try:
        for user in ("A", "B"):
            await service.wait((await service.submit(user, "p", make_spec(project, ["true"]))).id)
        assert list(service._turns) == ["B"]  # A, idle and served longest ago, is a newcomer again
    finally:
        await service.shutdown()
