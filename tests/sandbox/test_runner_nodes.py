"""Runner nodes for real: a Redis server of the test's own, `codeyard runner` processes on bubblewrap, and
runs dispatched to them through the runners backend (sandbox.backends.remote), as an IDE replica dispatches them."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis import Redis as SyncRedis
from redis_server import RedisServer

from ide_server.leases import connect
from sandbox.backend import RunSpec
from sandbox.backends.dispatch import GROUP, RUNS_STREAM, heartbeat_key, in_key
from sandbox.backends.remote import RemoteBackend, runner_of
from sandbox.cgroups import RunCgroup, cgroup_dirs, remove_cgroup
from sandbox.limits import Limits
from sandbox.packages.install import runners_installer
from sandbox.packages.proxy import PYPI_HOSTS
from sandbox.verdict import Verdict
from sandbox.workspace import umount

CODEYARD = str(Path(sys.executable).with_name("codeyard"))
LIMITS = Limits(cpu_seconds=5, wall_seconds=20, memory_bytes=128 << 20, pids=64, output_bytes=256 << 10)


@pytest.fixture
def redis_server(tmp_path):
    server = RedisServer(tmp_path).start()
    yield server
    server.kill()


@pytest.fixture
def redis_url(redis_server) -> str:
    return redis_server.url


@pytest.fixture
def data_dir(tmp_path) -> Path:
    path = tmp_path / "data"
    (path / "projects" / "p1").mkdir(parents=True)
    return path


class Runners:
    """`codeyard runner` processes of one test, each with its own folder for run workspaces."""

    def __init__(self, redis_url: str, data_dir: Path, tmp_path: Path) -> None:
        self.redis_url, self.data_dir, self.tmp_path = redis_url, data_dir, tmp_path
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, slots: int = 2, cgroup: Path | None = None, prefix: tuple[str, ...] = (),
              **env_vars: str) -> subprocess.Popen:
        """Start a runner (in `cgroup`, a v1 memory cgroup folder; through the command `prefix`; with env_vars in its
        environment) and wait for its first heartbeat."""
        env = {**os.environ, "CODEYARD_REDIS_URL": self.redis_url, "CODEYARD_DATA_DIR": str(self.data_dir),
               "CODEYARD_SANDBOX_BACKEND": "bwrap", "CODEYARD_SANDBOX_DIR": str(self.runs_dir(name)), **env_vars}
        log = open(self.tmp_path / f"runner-{name}.log", "wb")
        proc = subprocess.Popen([*prefix, CODEYARD, "runner", "--slots", str(slots), "--name", name, "--drain-seconds", "30"],
                                env=env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=(lambda: (cgroup / "cgroup.procs").write_text("0")) if cgroup else None)
        self.procs[name] = proc
        redis = SyncRedis.from_url(self.redis_url)
        deadline = time.monotonic() + 30
        while not redis.exists(heartbeat_key(name)):
            assert proc.poll() is None, (self.tmp_path / f"runner-{name}.log").read_text()
            assert time.monotonic() < deadline, f"runner {name} sent no heartbeat"
            time.sleep(0.05)
        redis.close()
        return proc

    def runs_dir(self, name: str) -> Path:
        """Outside tmp_path (0700), which run uids could not enter."""
        return Path(tempfile.gettempdir()) / f"codeyard-runner-runs-{self.tmp_path.name}-{name}"

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.procs.items():
            proc.wait(30)
            shutil.rmtree(self.runs_dir(name), ignore_errors=True)


@pytest.fixture
def runners(redis_url, data_dir, tmp_path):
    group = Runners(redis_url, data_dir, tmp_path)
    yield group
    group.stop()


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """Two runners of one slot each (s1, s2), started once for the tests that only dispatch runs to them."""
    root = tmp_path_factory.mktemp("shared")
    server = RedisServer(root).start()
    (root / "data" / "projects" / "p1").mkdir(parents=True)
    group = Runners(server.url, root / "data", root)
    group.start("s1", slots=1)
    group.start("s2", slots=1)
    yield group
    group.stop()
    server.kill()


@pytest.fixture
async def to_shared(shared):
    """The runners backend of a replica whose runners are `shared`."""
    remote = RemoteBackend(connect(shared.redis_url), start_timeout=15)
    yield remote
    await remote.close()


@pytest.fixture
async def remote(redis_url):
    remote = RemoteBackend(connect(redis_url), start_timeout=15)
    yield remote
    await remote.close()


def spec(data_dir: Path, *argv: str, **kwargs) -> RunSpec:
    return RunSpec(list(argv), data_dir / "projects" / "p1", LIMITS, **kwargs)


async def test_a_run_on_a_runner_streams_output_and_input_and_writes_back(shared, to_shared):
    data_dir = shared.data_dir
    run = await to_shared.start(spec(data_dir, "python3", "-c",
                                   "import sys; name = input(); print('hi', name); print('oops', file=sys.stderr);"
                                   "open('out.txt', 'w').write(name)"))
    await run.send_stdin(b"ann\n")
    await run.close_stdin()
    chunks = [chunk async for chunk in run.chunks()]
    result = await run.result()
    assert result.verdict is Verdict.OK, result.message
    assert result.stdout == b"hi ann\n" and result.stderr == b"oops\n"
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"hi ann\n"
    assert runner_of(run) in ("s1", "s2")
    assert result.files_written == ["out.txt"]
    assert (data_dir / "projects" / "p1" / "out.txt").read_text() == "ann"
    # Given before the run was queued, the input travelled in the run's entry: its in stream only says it ended
    assert [f[b"t"] for _, f in await to_shared.redis.xrange(in_key(run.id))] == [b"ended"]


async def test_input_given_while_a_run_waits_or_runs_reaches_it_in_order(runners, remote, data_dir, redis_url):
    """Input sent after the run was queued goes through its in stream: what was said while it waited for a slot is
    applied when it starts, and what comes while it runs after that."""
    runners.start("only", slots=1)
    blocker = await remote.start(spec(data_dir, "python3", "-c", "import time; time.sleep(1.5)"))
    while runner_of(blocker) is None:
        await asyncio.sleep(0.05)
    echo = "import sys\nfor line in sys.stdin: print(line.strip(), flush=True)"
    run = await remote.start(spec(data_dir, "python3", "-c", echo))
    await run.send_stdin(b"given\n")  # (with the entry)
    await asyncio.sleep(0.3)  # queued behind the blocker
    assert runner_of(run) is None
    await run.send_stdin(b"while queued\n")
    chunks = run.chunks()
    assert (await anext(chunks)).data.startswith(b"given")
    await run.send_stdin(b"while running\n")
    await run.close_stdin()
    result = await run.result()
    assert result.verdict is Verdict.OK and result.stdout == b"given\nwhile queued\nwhile running\n", result
    assert (await blocker.result()).verdict is Verdict.OK


async def test_what_a_run_writes_belongs_to_the_owner_of_its_folder(shared, to_shared):
    """A runner (root) hands what a run wrote to the folder's owner: a replica running as another uid (10001 in
    the app image) must change and remove it, e.g. a package install's downloads."""
    project = shared.data_dir / "projects" / "p2"
    project.mkdir()
    os.chown(project, 10001, 10001)
    run = await to_shared.start(RunSpec(["python3", "-c", "import os; os.makedirs('a/b'); open('a/b/c.txt', 'w').write('x')"],
                                        project, LIMITS))
    assert (await run.result()).verdict is Verdict.OK
    assert {(p.stat().st_uid, p.stat().st_gid) for p in (project / "a", project / "a/b", project / "a/b/c.txt")} == {(10001, 10001)}


async def test_runs_spread_over_runners_with_free_slots(shared, to_shared):
    listed = subprocess.run([CODEYARD, "runner", "--list"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "CODEYARD_REDIS_URL": shared.redis_url, "CODEYARD_SANDBOX_BACKEND": "bwrap"})
    assert [line.split(":")[0] for line in listed.stdout.splitlines()] == ["s1", "s2"], listed.stderr
    assert "0/1 slots busy" in listed.stdout
    sleeper = "import time; began = time.time(); time.sleep(1); print(began, time.time())"
    runs = [await to_shared.start(spec(shared.data_dir, "python3", "-c", sleeper)) for _ in range(4)]
    results = await asyncio.gather(*(run.result() for run in runs))
    assert [r.verdict for r in results] == [Verdict.OK] * 4
    assert {runner_of(run) for run in runs} == {"s1", "s2"}
    # Two at a time, not one after another: a run on s1 sleeps while one on s2 does (the sandboxes share the host's
    # clock). Overlap, not a wall-clock total, so a loaded CI host's slow sandbox start-ups cannot fail it.
    spans = [(runner_of(run), *map(float, result.stdout.split())) for run, result in zip(runs, results)]
    assert any(a[0] != b[0] and a[1] < b[2] and b[1] < a[2] for a in spans for b in spans), spans


async def test_cancel_and_limits_travel(shared, to_shared):
    data_dir = shared.data_dir
    run = await to_shared.start(spec(data_dir, "sleep", "30"))
    while runner_of(run) is None:
        await asyncio.sleep(0.05)
    # Another queued while both runners are busy and cancelled there: the runner that takes it does not run it
    other = await to_shared.start(spec(data_dir, "sleep", "30"))
    while runner_of(other) is None:  # both busy before it is queued: two queued at once may reach Redis in either order
        await asyncio.sleep(0.05)
    queued = await to_shared.start(spec(data_dir, "touch", "never.txt"))
    queued.cancel()
    while not await to_shared.redis.xlen(in_key(queued.id)):  # its cancel is told before a slot frees
        await asyncio.sleep(0.02)  # (a fixed 0.1 s was once too short in CI: the run started and ran)
    run.cancel()
    other.cancel()
    assert (await run.result()).verdict is Verdict.CANCELLED
    result = await queued.result()
    assert result.verdict is Verdict.CANCELLED and result.message == "cancelled before it started", result
    assert not (data_dir / "projects" / "p1" / "never.txt").exists()
    looping = await to_shared.start(RunSpec(["python3", "-c", "while True: pass"], data_dir / "projects" / "p1",
                                         Limits(cpu_seconds=1, wall_seconds=10)))
    assert (await looping.result()).verdict is Verdict.TIME_LIMIT


async def test_a_spec_outside_the_shared_folders_or_a_malformed_entry_is_refused(shared, to_shared, tmp_path):
    await to_shared.redis.xadd(RUNS_STREAM, {"junk": "1"})  # dropped; the runner goes on
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = await (await to_shared.start(RunSpec(["true"], elsewhere, LIMITS))).result()
    assert result.verdict is Verdict.INTERNAL_ERROR and "outside this runner's shared folders" in result.message
    deadline = time.monotonic() + 10  # (the other runner may have read the junk and not yet deleted it)
    while await to_shared.redis.xlen(RUNS_STREAM) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert await to_shared.redis.xlen(RUNS_STREAM) == 0


# Asks the proxy for two tunnels through the forwarder (argv[1], "http://127.0.0.1:<port>"), then tries the index itself.
ASK_PROXY = r"""
import socket, sys
host, port = sys.argv[1].rsplit("/", 1)[1].rsplit(":", 1)
for target in ("pypi.org:443", sys.argv[2]):
    with socket.create_connection((host, int(port))) as proxy:
        proxy.sendall(b"CONNECT %s HTTP/1.1\r\n\r\n" % target.encode())
        print(target, proxy.recv(200).split(b"\r\n")[0].decode(), flush=True)
try:
    socket.create_connection(("pypi.org", 443), timeout=3)
    print("direct: reached")
except OSError:
    print("direct: no network")
"""


async def test_a_runs_only_way_out_is_the_index_through_its_runners_own_proxy(shared, to_shared):
    """A spec's index_hosts travel and the runner serves the proxy: the index answers, a service on the runner's
    loopback is refused, and nothing is reachable but through the proxy."""
    with socket.create_server(("127.0.0.1", 0)) as service:
        target = f"127.0.0.1:{service.getsockname()[1]}"
        run = await to_shared.start(spec(shared.data_dir, "python3", "-c", ASK_PROXY, "{proxy}", target,
                                         index_hosts=PYPI_HOSTS))
        result = await run.result()
    assert result.verdict is Verdict.OK, (result.message, result.stderr)
    assert result.stdout.decode().splitlines() == ["pypi.org:443 HTTP/1.1 200 Connection established",
                                                   f"{target} HTTP/1.1 403 Forbidden", "direct: no network"]
    refused = await (await to_shared.start(spec(shared.data_dir, "true", index_hosts=frozenset({"example.com"})))).result()
    assert refused.verdict is Verdict.INTERNAL_ERROR and "example.com is not a package index" in refused.message


async def test_a_package_install_runs_on_a_runner_behind_that_runners_proxy(runners, remote, data_dir):
    """The replica (this process) serves no proxy: the runner, a process of its own, serves it in its own
    temporary folder; the environment lands in the shared packages folder and a run on the runner imports it."""
    packages, runner_tmp = (Path(tempfile.mkdtemp(prefix=f"codeyard-runner-{what}-")) for what in ("packages", "tmp"))
    try:
        for folder in (packages, runner_tmp):
            os.chmod(folder, 0o711)
        runners.start("installs", CODEYARD_PACKAGES_DIR=str(packages), TMPDIR=str(runner_tmp))
        installer = runners_installer(remote, packages)
        assert installer is not None
        sockets: set[Path] = set()

        async def watch() -> None:
            while True:
                sockets.update([*runner_tmp.glob("codeyard-proxy-*/*.sock"), *packages.rglob("*.sock")])
                await asyncio.sleep(0.02)

        watching = asyncio.create_task(watch())
        try:
            env = await installer.install(["six"])
        finally:
            watching.cancel()
        assert "six" in env.pins
        assert sockets and all(path.is_relative_to(runner_tmp) for path in sockets), sockets
        result = await (await remote.start(spec(data_dir, "python3", "-c", "import six; print(six.__version__)",
                                                mounts=(env.mount(),), env=env.env()))).result()
        assert result.verdict is Verdict.OK and result.stdout.decode().strip() == env.pins["six"], result
    finally:
        shutil.rmtree(packages, ignore_errors=True)
        shutil.rmtree(runner_tmp, ignore_errors=True)


async def test_a_runner_killed_mid_run_fails_the_run_with_a_message(runners, remote, data_dir, redis_url):
    runners.start("victim")
    before = _run_cgroups()
    run = await remote.start(spec(data_dir, "python3", "-c", "import time; print('started', flush=True); time.sleep(60)"))
    first = await anext(run.chunks())
    assert first.data.startswith(b"started")
    runners.procs["victim"].kill()
    began = time.monotonic()
    # Back at once under its name (a restarted container): the new process's heartbeat keeps no dead run alive.
    redis = aioredis.from_url(redis_url)
    await redis.hset(heartbeat_key("victim"), "incarnation", "a-later-process")
    await redis.pexpire(heartbeat_key("victim"), 60_000)
    await redis.aclose()
    result = await asyncio.wait_for(run.result(), 15)
    assert result.verdict is Verdict.INTERNAL_ERROR
    assert "runner victim stopped during the run" in result.message
    assert time.monotonic() - began < 15  # the heartbeat's time to live and a read, well before the run's own 60 s
    left = _run_cgroups() - before
    assert left, "the killed runner's run left no cgroup behind: nothing to clean up"
    runners.start("successor")  # a runner starting on the host removes the cgroups of runs nobody runs any more
    assert not left & _run_cgroups()
    _clean_after_kill(runners.runs_dir("victim"), before)


async def test_a_runner_removes_the_runs_a_runner_in_another_cgroup_left(runners):
    """A runner container created anew, or a runner another job started, has a cgroup of its own, beside the old
    one's: a starting runner kills and removes the runs' cgroups of a sibling no other process lives in any more
    (its runner is gone; here one of its runs outlived it), never a live one's."""
    own = next((line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                if "memory" in line.split(":")[1].split(",")), None)
    hierarchies = [Path("/sys/fs/cgroup") / name for name in ("memory", "pids", "cpuacct")]
    if own is None or not all(h.is_dir() for h in hierarchies) or RunCgroup.base_relpath() is None:
        pytest.skip("needs cgroup v1 with memory, pids and cpuacct hierarchies")
    parent = f"{own.rstrip('/')}/siblings-{os.getpid()}-{time.monotonic_ns()}"
    runs = {who: f"{parent}/{who}/codeyard/run-1-left" for who in ("old", "live")}
    for relpath in (*runs.values(), f"{parent}/new"):
        for hierarchy in hierarchies:
            (hierarchy / relpath.lstrip("/")).mkdir(parents=True)

    def sleeper(*relpaths: str) -> subprocess.Popen:
        def join() -> None:
            for relpath in relpaths:
                (hierarchies[0] / relpath.lstrip("/") / "cgroup.procs").write_text("0")
        return subprocess.Popen(["sleep", "60"], preexec_fn=join)

    outlived = sleeper(runs["old"])  # a run whose runner (in <parent>/old) is gone
    live_runner, live_run = sleeper(f"{parent}/live"), sleeper(runs["live"])
    try:
        runners.start("new", cgroup=hierarchies[0] / parent.lstrip("/") / "new")
        assert outlived.wait(5) == -signal.SIGKILL
        assert not any((hierarchy / runs["old"].lstrip("/")).exists() for hierarchy in hierarchies)
        assert live_run.poll() is None and all((hierarchy / runs["live"].lstrip("/")).is_dir() for hierarchy in hierarchies)
    finally:
        for proc in (outlived, live_runner, live_run):
            proc.kill()
            proc.wait()
        runners.stop()
        remove_cgroup(parent)


async def test_a_run_taken_by_a_runner_that_died_before_starting_it_runs_elsewhere(runners, remote, data_dir, redis_url):
    redis = aioredis.from_url(redis_url)
    await redis.xgroup_create(RUNS_STREAM, GROUP, id="0", mkstream=True)
    run = await remote.start(spec(data_dir, "python3", "-c", "print('done')"))
    taken = None
    while not taken:  # read, then "died": no heartbeat
        taken = await redis.xreadgroup(GROUP, "ghost", {RUNS_STREAM: ">"}, count=1, block=100)
    assert runner_of(run) is None
    runners.start("r1")
    result = await run.result()
    assert result.verdict is Verdict.OK and result.stdout == b"done\n" and runner_of(run) == "r1"
    assert (await redis.xpending(RUNS_STREAM, GROUP))["pending"] == 0
    assert await redis.xlen(RUNS_STREAM) == 0  # started runs leave the stream
    await redis.aclose()


async def test_a_draining_runner_finishes_its_run_and_takes_no_more(runners, remote, data_dir, redis_url):
    first = runners.start("first", slots=1)
    run = await remote.start(spec(data_dir, "python3", "-c", "import time; time.sleep(1.5); print('finished')"))
    while runner_of(run) is None:
        await asyncio.sleep(0.05)
    first.send_signal(signal.SIGTERM)
    await asyncio.sleep(0.3)
    later = await remote.start(spec(data_dir, "python3", "-c", "print('later')"))
    result = await run.result()
    assert result.verdict is Verdict.OK and result.stdout == b"finished\n"
    assert await asyncio.to_thread(first.wait, 10) == 0
    redis = aioredis.from_url(redis_url)
    assert not await redis.exists(heartbeat_key("first"))
    await redis.aclose()
    runners.start("second", slots=1)
    assert (await later.result()).stdout == b"later\n" and runner_of(later) == "second"


async def test_no_runner_means_a_clear_error(redis_url, data_dir):
    remote = RemoteBackend(connect(redis_url), start_timeout=1)
    result = await (await remote.start(spec(data_dir, "true"))).result()
    await remote.close()
    assert result.verdict is Verdict.INTERNAL_ERROR and "no runner started the run" in result.message


def _run_cgroups() -> set[Path]:
    base = RunCgroup.base_relpath()
    return {child for parent in cgroup_dirs(base) for child in parent.iterdir() if child.is_dir()} if base else set()


def _clean_after_kill(runs_dir: Path, cgroups_before: set[Path]) -> None:
    """What a killed runner could not clean: its run's workspace mount and cgroup (its processes died with it)."""
    deadline = time.monotonic() + 5
    for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
        if str(runs_dir) in line.split()[4]:
            umount(Path(line.split()[4]))
    shutil.rmtree(runs_dir, ignore_errors=True)
    base = RunCgroup.base_relpath()
    for cgroup in _run_cgroups() - cgroups_before:
        while time.monotonic() < deadline:
            try:
                remove_cgroup(f"{base}/{cgroup.name}")
                break
            except OSError:
                time.sleep(0.1)


async def test_a_redis_restart_during_a_run_loses_nothing(runners, remote, data_dir, redis_server):
    """Redis restarted from its saved data while a run is going: output before and after reaches the replica,
    and the run ends normally."""
    runners.start("r1")
    run = await remote.start(spec(data_dir, "python3", "-c",
                                  "import time; print('before', flush=True); time.sleep(3); print('after')"))
    first = await anext(run.chunks())
    assert first.data.startswith(b"before")
    await remote.redis.save()
    redis_server.kill()
    await asyncio.sleep(0.5)
    redis_server.start(save=True)
    result = await run.result()
    assert result.verdict is Verdict.OK, result.message
    assert result.stdout == b"before\nafter\n"
