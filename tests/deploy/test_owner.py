"""Who runs the apps among replicas (deploy_service.owner), on the suite's real Redis: one holder at a
time, the others learn its addresses, and when it stops renewing another takes over."""

from __future__ import annotations

import asyncio
import os
import secrets

import pytest
import redis.asyncio as aioredis

from deploy_service import owner
from deploy_service.owner import Ownership, Replica


@pytest.fixture
async def redis_url(monkeypatch):
    base = os.environ.get("CODEYARD_TEST_REDIS_URL")
    if not base:
        pytest.fail("CODEYARD_TEST_REDIS_URL is not set: run the tests through scripts/run-tests.sh")
    monkeypatch.setattr(owner, "LEASE_KEY", f"codeyard:test-deploys-owner:{secrets.token_hex(4)}")
    monkeypatch.setattr(owner, "LEASE_MS", 1200)
    monkeypatch.setattr(owner, "RENEW_SECONDS", 0.2)
    yield base
    client = aioredis.from_url(base)
    await client.delete(owner.LEASE_KEY)
    await client.aclose()


class ReplicaUnderTest:
    """A replica's ownership with its keep() loop running, counting what it was told."""

    def __init__(self, name: str, url: str, can_own: bool = True) -> None:
        self.ownership = Ownership(Replica(name, f"{name}:8000", f"{name}:8001"), url, can_own)
        self.events: list[str] = []
        self.task = asyncio.create_task(self.ownership.keep(self._gained, self._lost))

    async def _gained(self) -> None:
        self.events.append("gained")

    async def _lost(self) -> None:
        self.events.append("lost")

    async def crash(self) -> None:
        """Stop renewing without letting go (the process died)."""
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.ownership.redis.aclose()

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.ownership.close()


async def until(check, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_one_replica_holds_the_apps_and_another_takes_over_when_it_dies(redis_url):
    first = ReplicaUnderTest("first", redis_url)
    await until(lambda: first.ownership.is_owner)
    second = ReplicaUnderTest("second", redis_url)
    watcher = ReplicaUnderTest("watcher", redis_url, can_own=False)  # no sandbox backend here: never runs apps
    try:
        await until(lambda: second.ownership.owner == first.ownership.here)
        await asyncio.sleep(1.5)  # longer than the lease: the holder keeps it by renewing
        assert first.ownership.is_owner and not second.ownership.is_owner
        assert second.ownership.owner.apps == "first:8001"  # where to send app traffic
        await first.crash()
        await until(lambda: second.ownership.is_owner, timeout=5)  # once the lease expired
        await until(lambda: watcher.ownership.owner == second.ownership.here)
        assert second.events == ["gained"] and first.events == ["gained"] and watcher.events == []
    finally:
        await second.stop()
        await watcher.stop()


async def test_a_clean_stop_hands_over_at_once_and_a_returning_holder_is_told_it_lost(redis_url):
    first = ReplicaUnderTest("first", redis_url)
    await until(lambda: first.ownership.is_owner)
    second = ReplicaUnderTest("second", redis_url)
    await until(lambda: second.ownership.owner is not None)
    await first.stop()  # releases the lease
    await until(lambda: second.ownership.is_owner, timeout=1.0)  # well before it would have expired
    # A holder that was cut off long enough for the lease to pass on learns it lost, and stops its apps.
    third = ReplicaUnderTest("third", redis_url)
    try:
        third.ownership.owner = third.ownership.here  # (it believed it held the lease)
        await until(lambda: third.events == ["lost"])
        assert third.ownership.owner == second.ownership.here and second.ownership.is_owner
    finally:
        await third.stop()
        await second.stop()
