"""Deployed apps hosted on runner nodes: a Redis server of the test's own, runners in this process on bubblewrap,
and the replica's side (`RunnerHosting`) placing apps on them and reaching them through the runners' relays."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
import pytest_asyncio
from redis_server import RedisServer
from waiting import eventually

from deploy_service.instance import APP_LIMITS, AppInstance, Launch
from deploy_service.upstream import Upstream, UpstreamError
from ide_server.leases import connect
from sandbox import runner_apps
from sandbox.backends.choice import make_backend
from sandbox.backends.dispatch import heartbeat_key
from sandbox.backends.remote_apps import RunnerApp, RunnerHosting
from sandbox.errors import SandboxUnavailable
from sandbox.runner import Runner

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the runners live in the module's loop

SERVER = ("import http.server, os\n"
          "class H(http.server.BaseHTTPRequestHandler):\n"
          "    def do_GET(self):\n"
          "        body = ('hello from ' + os.environ['WHO']).encode()\n"
          "        self.send_response(200); self.send_header('content-length', str(len(body))); self.end_headers()\n"
          "        self.wfile.write(body)\n"
          "    def log_message(self, *args): print('served', flush=True)\n"
          "http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n")


class InProcessRunners:
    """Runners of one test in this process (each with its own Redis client), started and left on purpose."""

    def __init__(self, url: str, data_dir: Path) -> None:
        self.url, self.data_dir = url, data_dir
        self.runners: dict[str, tuple[Runner, asyncio.Event, asyncio.Task[None]]] = {}

    async def start(self, name: str, cpus: float) -> Runner:
        runner = Runner(connect(self.url), make_backend("bwrap"), (self.data_dir,), slots=1, name=name, cpus=cpus,
                        apps_host="127.0.0.1")
        stop = asyncio.Event()
        self.runners[name] = (runner, stop, asyncio.create_task(runner.serve(stop, drain_seconds=5)))
        while not await runner.redis.exists(heartbeat_key(name)):
            await asyncio.sleep(0.02)
        return runner

    async def stop(self, name: str) -> None:
        runner, stop, task = self.runners.pop(name)
        stop.set()
        await task
        await runner.redis.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runners(tmp_path_factory):
    """Runners big (1.5 CPUs) and small (1 CPU), shared by the tests here (each stop waits out a 1 s read)."""
    root = tmp_path_factory.mktemp("apps")
    server = RedisServer(root).start()
    data_dir = root / "data"
    (data_dir / "deploy" / "r1").mkdir(parents=True)
    (data_dir / "deploy" / "r1" / "app.py").write_text(SERVER)
    group = InProcessRunners(server.url, data_dir)
    await asyncio.gather(group.start("big", cpus=1.5), group.start("small", cpus=1.0))
    yield group
    await asyncio.gather(*(group.stop(name) for name in list(group.runners)))
    server.kill()


def launch(data_dir: Path, who: str) -> Launch:
    return Launch(data_dir / "deploy" / "r1", ["python3", "app.py"], {"WHO": who}, limits=APP_LIMITS, cpus=1.0)


async def get(instance: AppInstance) -> bytes:
    assert instance.upstream is not None
    response = await instance.upstream.request("GET", "/", [(b"host", b"app")])
    assert response.status == 200
    return b"".join([chunk async for chunk in response.body()])


async def test_apps_go_to_the_runner_with_most_free_cpu_and_are_reached_through_its_relay(runners, monkeypatch):
    hosting = RunnerHosting(connect(runners.url))
    lines: list[str] = []
    first = AppInstance(hosting, launch(runners.data_dir, "first"), lambda stream, line: lines.append(line))
    second = AppInstance(hosting, launch(runners.data_dir, "second"), lambda stream, line: None)
    try:
        await first.start()  # big: 1.5 CPUs free against 1.0
        await second.start()  # small: 1.0 free against big's 0.5 (the first counted before big's next heartbeat)
        assert [first.process.runner, second.process.runner] == ["big", "small"]  # type: ignore[attr-defined]
        assert await asyncio.gather(first.wait_healthy(20), second.wait_healthy(20)) == [None, None]
        assert await get(first) == b"hello from first" and await get(second) == b"hello from second"
        assert first.address.startswith("127.0.0.1:")
        for _ in range(100):  # the app's log comes back too, on its own way (the out stream)
            if "served\n" in lines:
                break
            await asyncio.sleep(0.05)
        assert "served\n" in lines, lines

        # Without the relay's token: the connection is closed, the app never hears of it
        host, _, port = first.address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET / HTTP/1.1\r\nhost: app\r\n\r\n" + b"x" * 32)
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        wrong = Upstream(first.address, os.urandom(32))
        with pytest.raises(UpstreamError):
            await wrong.request("GET", "/", [(b"host", b"app")])

        await second.stop()
        assert second.exited
        # an app's exit is told before the runner's task forgets it (CI runs saw the gap, for either runner)
        await eventually(lambda: not runners.runners["small"][0].apps.apps, pause=0.05, what="the small runner forgetting it")

        # The replica that placed `first` goes away (its keep-alive ends): the runner stops the app by itself
        monkeypatch.setattr(runner_apps, "ORPHAN_AFTER_S", 0.0)
        await hosting.close()
        await asyncio.wait_for(first.wait_exit(), 10)
        await eventually(lambda: not runners.runners["big"][0].apps.apps, pause=0.05, what="the big runner forgetting it")
    finally:
        await first.stop()
        await second.stop()
        await hosting.close()
        await hosting.redis.aclose()


async def test_an_app_whose_runner_went_away_ends_with_a_message_and_starts_again_on_another(runners):
    await runners.start("gone", cpus=2.0)
    hosting = RunnerHosting(connect(runners.url))
    instance = AppInstance(hosting, launch(runners.data_dir, "one"), lambda stream, line: None)
    again = AppInstance(hosting, launch(runners.data_dir, "one"), lambda stream, line: None)
    try:
        await instance.start()
        assert isinstance(instance.process, RunnerApp) and instance.process.runner == "gone"
        assert await instance.wait_healthy(20) is None
        # Another process now beats under the runner's name (a restarted container): the app it hosted is gone
        runner, stop, _ = runners.runners["gone"]
        runner.incarnation = runner.apps.incarnation = "a-later-process"  # type: ignore[union-attr]
        await runner.redis.hset(heartbeat_key("gone"), "incarnation", runner.incarnation)
        await asyncio.wait_for(instance.wait_exit(), 5)
        assert instance.how_it_ended(await instance.wait_exit()).startswith("runner gone stopped hosting it")
        await instance.stop()

        stop.set()  # it drains: no app goes there, though it has the most free CPU
        while (await runner.redis.hget(heartbeat_key("gone"), "draining")) != b"1":
            await asyncio.sleep(0.02)
        await again.start()
        assert again.process.runner in ("big", "small")  # type: ignore[attr-defined]
        assert await again.wait_healthy(20) is None and await get(again) == b"hello from one"
    finally:  # (the drain ends within the test: the leftovers check after it blocks the loop)
        await asyncio.gather(instance.stop(), again.stop(), runners.stop("gone"))
        await hosting.close()
        await hosting.redis.aclose()


async def test_no_runner_that_hosts_apps_is_a_clear_error(tmp_path):
    server = RedisServer(tmp_path).start()
    hosting = RunnerHosting(connect(server.url))
    instance = AppInstance(hosting, launch(tmp_path, "x"), lambda stream, line: None)
    try:
        with pytest.raises(SandboxUnavailable, match="no runner node can host the app now"):
            await instance.start()
    finally:
        await hosting.close()
        await hosting.redis.aclose()
        server.kill()
