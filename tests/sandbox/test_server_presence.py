"""Which unfinished runs a server closes: only those of servers that stopped.

Before, every starting replica closed every unfinished run, its live peers' included (issue 25's
note on `serve` with several replicas). Real Redis for the replicas' heartbeats, a real SQLite
database with the migrations applied.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from collab.editors import OpenEditors
from ide_server import db as database
from ide_server.models import Project, User
from sandbox.models import RunRow
from sandbox.server_presence import KEY_PREFIX, AloneOnHost, OrphanedRuns, SharedPresence, new_server_id
from sandbox.service import ProjectRuns


@pytest.fixture
def runs(tmp_path: Path) -> ProjectRuns:
    engine = database.make_engine(f"sqlite:///{tmp_path}/runs.db")
    database.migrate(engine)
    sessions = database.make_sessionmaker(engine)
    with sessions() as db, db.begin():
        db.add(User(id=1, username="alice", password_hash="-"))
        db.add(Project(id="p1", name="one", template="python", visibility="private"))
    return ProjectRuns(None, "no backend here", sessions=sessions, projects_dir=tmp_path, editors=OpenEditors(None),
                       max_running=1, max_running_per_user=1, max_per_user=1, server_id=new_server_id())


def record(runs: ProjectRuns, run_id: str, server_id: str | None, status: str = "running") -> None:
    with runs.sessions() as db, db.begin():
        db.add(RunRow(id=run_id, project_id="p1", user_id=1, argv=["python3", "main.py"], status=status,
                      server_id=server_id))


def statuses(runs: ProjectRuns) -> dict[str, tuple[str, str | None]]:
    with runs.sessions() as db:
        return {row.id: (row.status, row.verdict) for row in db.query(RunRow)}


def sweeper(runs: ProjectRuns, presence: AloneOnHost | SharedPresence) -> OrphanedRuns:
    return OrphanedRuns(presence, runs.unfinished_servers, runs.close_runs_of)


async def test_a_server_alone_closes_every_unfinished_run_but_its_own(runs: ProjectRuns) -> None:
    alone = AloneOnHost()
    record(runs, "before-ids", None, "queued")
    record(runs, "crashed", "a-dead-server")
    record(runs, "done", "a-dead-server", "finished")
    record(runs, "mine", alone.server_id)
    assert await sweeper(runs, alone).sweep() == 2
    assert statuses(runs) == {"before-ids": ("finished", "internal_error"), "crashed": ("finished", "internal_error"),
                              "done": ("finished", None), "mine": ("running", None)}


@pytest.fixture
async def redis_url() -> str:
    url = os.environ.get("CODEYARD_TEST_REDIS_URL")
    if not url:
        pytest.fail("CODEYARD_TEST_REDIS_URL is not set: run the tests through scripts/run-tests.sh")
    return url


async def test_replicas_close_only_the_runs_of_a_server_gone_for_two_sweeps(runs: ProjectRuns, redis_url: str) -> None:
    me = SharedPresence(redis_url, beat_s=0.1, ttl_s=0.6)
    peer = SharedPresence(redis_url, beat_s=0.1, ttl_s=0.6)
    await me.start()
    await peer.start()
    try:
        record(runs, "mine", me.server_id)
        record(runs, "peers", peer.server_id)
        record(runs, "before-ids", None)
        orphans = sweeper(runs, me)
        assert await orphans.sweep() == 1  # a record without a server: no server follows it
        # A Redis restart empties the keys until the next beat: a peer missing once is not dead.
        await me.redis.delete(KEY_PREFIX + peer.server_id)
        assert await orphans.sweep() == 0
        for _ in range(100):  # the peer's next beat puts its key back
            if await me.redis.exists(KEY_PREFIX + peer.server_id):
                break
            await asyncio.sleep(0.05)
        assert await orphans.sweep() == 0
        assert statuses(runs)["peers"] == ("running", None)

        assert peer._beating is not None
        peer._beating.cancel()  # the peer dies without a word; its key expires
        await asyncio.sleep(0.8)
        assert await orphans.sweep() == 0  # missing once
        assert await orphans.sweep() == 1  # missing twice in a row: its runs end
        assert statuses(runs) == {"mine": ("running", None), "peers": ("finished", "internal_error"),
                                  "before-ids": ("finished", "internal_error")}
    finally:
        await peer.close()
        await me.close()
    check = aioredis.from_url(redis_url)
    assert await check.exists(KEY_PREFIX + me.server_id) == 0  # a server that stops cleanly leaves no key
    await check.aclose()


def test_each_start_is_a_new_server_that_fits_the_runs_column() -> None:
    ids = {AloneOnHost().server_id for _ in range(20)}
    assert len(ids) == 20
    assert all(len(server_id) <= RunRow.__table__.c.server_id.type.length for server_id in ids)
