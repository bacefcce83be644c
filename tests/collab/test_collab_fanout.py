"""Two replicas in one process over a real Redis: many rooms opening at once share one listener.

Under a class's load, rooms opened together each started a Redis listener; two listeners read the
one subscription socket at once and the fan-out died ("readuntil() called while another coroutine
is already waiting"), so edits stopped reaching the other replica (issue 25).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from collab_testkit import PyClient
from waiting import eventually

from collab.fanout import Fanout
from collab.room import RoomKey
from collab.rooms import RoomManager
from collab.store import UpdateStore
from ide_server import leases

ROOMS = 30


@pytest.fixture
async def two_replicas(store: UpdateStore, project_root: Path, redis_url: str):
    managers = []
    for _ in range(2):
        fanout = Fanout(redis_url)
        managers.append((RoomManager(store, lambda k: project_root / k.project_id / k.file_path, fanout=fanout), fanout))
    yield [manager for manager, _ in managers]
    for manager, fanout in managers:
        await manager.shutdown()
        await fanout.close()


async def test_rooms_opened_together_keep_fanning_out(two_replicas: list[RoomManager], project_root: Path) -> None:
    project_id = f"fanout-{uuid.uuid4().hex[:8]}"
    (project_root / project_id).mkdir(parents=True)
    keys = [RoomKey(project_id, f"f{i}.py") for i in range(ROOMS)]
    for key in keys:
        (project_root / project_id / key.file_path).write_text("", encoding="utf-8")
    here, there = two_replicas
    writers = [PyClient(here, key, f"w{i}") for i, key in enumerate(keys)]
    readers = [PyClient(there, key, f"r{i}") for i, key in enumerate(keys)]
    await asyncio.gather(*(client.start() for client in writers + readers))
    for i, writer in enumerate(writers):
        writer.type(0, f"edit {i}\n")
    for i, reader in enumerate(readers):
        await eventually(lambda: str(reader.text) == f"edit {i}\n", timeout=10.0)
    await asyncio.gather(*(client.leave() for client in writers + readers))


async def test_more_claims_at_once_than_pooled_connections_wait_their_turn(redis_url: str) -> None:
    """redis-py's own pool refuses the 101st concurrent command ("Too many connections"): with a
    class's rooms each claiming its file every second, collab lost track of who writes which file."""
    redis = leases.connect(redis_url)
    holder = uuid.uuid4().hex
    try:
        claimed = await asyncio.gather(*(leases.claim(redis, f"codeyard:test-claim:{holder}:{i}", holder, 5000)
                                         for i in range(leases.REDIS_CONNECTIONS * 3)))
    finally:
        await redis.aclose()
    assert all(claimed)
