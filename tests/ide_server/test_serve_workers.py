"""`codeyard serve --workers 2` (issue 25): two processes on one port, one SQLite file and a private Redis.

Against real processes: two editors of one file on different workers converge, in the one worker hosting the
project's rooms; a save through one is read back through the other, also with the file
open in both; a run started through one is followed live, its input typed, and cancelled through the other; a web app's Webview
answers through either; deployed apps answer on the apps port through either; one model server serves the
model to both. Without redis-server, or with the LLM's gRPC port, exit 2.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
import websockets
from serve_process import codeyard_serve, free_port
from tiny_llm import save_tiny_chat_llama
from waiting import wait_until

from collab.client import CollabClient
from deploy_service.owner import LEASE_KEY
from ide_server.cli import main
from ide_server.settings import Settings

PASSWORD = "a long password"


class Workers:
    """The server's base URL, and each worker's pid and own port (to reach one worker on purpose)."""

    def __init__(self, url: str, data_dir: Path, apps_port: int | None = None) -> None:
        self.url, self.data_dir, self.apps_port = url, data_dir, apps_port
        port = int(url.rsplit(":", 1)[1])
        # (the shared socket is listed under one of the processes holding it: parent or a worker)
        holder = psutil.Process(next(c.pid for c in psutil.net_connections("tcp")
                                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid))
        parent = holder.parent() if "ide_server.workers" in holder.cmdline() else holder
        assert parent is not None
        self.pids = sorted(p.pid for p in parent.children() if "ide_server.workers" in p.cmdline())
        opened = {c.laddr.port for c in parent.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        listening = {pid: {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")
                           if c.status == psutil.CONN_LISTEN} - {port} for pid in self.pids}
        # a worker's own IDE port is opened by the parent; the apps ports (when served) by the worker itself
        self.own_urls = {pid: f"http://127.0.0.1:{own}" for pid, ports in listening.items() for own in ports & opened}
        self.own_apps = {pid: ports - opened - {apps_port} for pid, ports in listening.items()}

    def serving(self, local_port: int) -> int | None:
        """The worker holding the server end of the client connection from `local_port`."""
        for pid in self.pids:
            if any(c.raddr and c.raddr.port == local_port for c in psutil.Process(pid).net_connections("tcp")):
                return pid
        return None


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workers]:
    data_dir = tmp_path_factory.mktemp("workers")
    apps_port = free_port()
    with codeyard_serve(data_dir, {"CODEYARD_WORKERS": "2", "CODEYARD_DEPLOY_APPS_PORT": str(apps_port)}) as url:
        found = Workers(url, data_dir, apps_port)
        for _ in range(600):  # the first worker answers /readyz while the second is still starting
            if len(found.own_urls) == 2 and all(found.own_apps.values()):
                break
            time.sleep(0.1)
            found = Workers(url, data_dir, apps_port)
        yield found
    assert not (data_dir / "redis.sock").exists() or not _answers(data_dir / "redis.sock")  # Redis stopped with serve


def _answers(path: Path) -> bool:
    import redis

    try:
        return bool(redis.Redis(unix_socket_path=str(path)).ping())
    except redis.RedisError:
        return False


async def open_editor(url: str, project: str, cookie: str) -> CollabClient:
    """A y-websocket client on main.py through `url`, synced."""
    editor = CollabClient()
    await editor.connect(url.replace("http", "ws", 1) + f"/ws/collab/{project}/main.py", {"Cookie": cookie}, origin=url)
    await asyncio.wait_for(editor.synced.wait(), 10)
    return editor


def local_port(editor: CollabClient) -> int:
    assert editor.socket is not None
    return int(editor.socket.transport.get_extra_info("sockname")[1])


async def converged(editors: list[CollabClient], *markers: str) -> str:
    for _ in range(200):
        texts = {str(e.text) for e in editors}
        if len(texts) == 1 and all(m in next(iter(texts)) for m in markers):
            return texts.pop()
        await asyncio.sleep(0.05)
    raise AssertionError(f"the editors did not converge: {[str(e.text) for e in editors]}")


async def follow_run(url: str, run_id: str, cookie: str, typed: str | None = None) -> tuple[str, str]:
    """(verdict, stdout) of a run, followed on its socket to the exit frame; `typed`: its input."""
    stdout = ""
    async with asyncio.timeout(30), websockets.connect(url.replace("http", "ws", 1) + f"/ws/runs/{run_id}",
                                                       additional_headers={"Cookie": cookie}, origin=url) as ws:
        if typed is not None:
            await ws.send(json.dumps({"type": "stdin", "data": typed}))
        async for raw in ws:
            frame = json.loads(raw)
            if frame["type"] == "stdout":
                stdout += frame["data"]
            elif frame["type"] == "exit":
                return frame["verdict"], stdout
    raise AssertionError("the run's socket closed before its exit frame")


def test_two_workers_share_editors_runs_and_saves(workers: Workers) -> None:
    assert len(workers.pids) == 2 and len(workers.own_urls) == 2
    client = httpx.Client(base_url=workers.url, timeout=20)
    client.post("/api/auth/register", json={"username": "teacher", "password": PASSWORD}).raise_for_status()
    csrf = {"X-CSRF-Token": client.cookies["codeyard_csrf"]}
    project = client.post("/api/projects", json={"name": "class", "template": "python"}, headers=csrf).json()["id"]
    cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
    first, second = (workers.own_urls[pid] for pid in workers.pids)

    async def scenario() -> None:
        # Each worker's own port, to be sure of reaching both: on the shared port the kernel wakes every
        # worker for a connection and the first to accept it wins, so an idle host may favour one.
        one, other = [await open_editor(workers.own_urls[pid], project, cookie) for pid in workers.pids]
        assert [workers.serving(local_port(e)) for e in (one, other)] == workers.pids
        await one.append("# from the first worker\n")
        await other.append("# from the second worker\n")
        await converged([one, other], "first worker", "second worker")
        # In one process: the worker not hosting the project's rooms relays its editor's socket to the one that
        # does, on that worker's own port (spread over both, each keystroke crossed through Redis after its store).
        own_ports = {pid: int(url.rsplit(":", 1)[1]) for pid, url in workers.own_urls.items()}
        relaying = {pid for pid in workers.pids for c in psutil.Process(pid).net_connections("tcp")
                    if c.raddr and c.raddr.port in own_ports.values() and c.raddr.port != own_ports[pid]}
        assert len(relaying) == 1, relaying

        headers = {**csrf, "Cookie": cookie}
        program = "print(1)\n"
        put = httpx.put(f"{second}/api/projects/{project}/files/content/run.py", content=program.encode(),
                        headers=headers, timeout=20)
        put.raise_for_status()
        read = httpx.get(f"{first}/api/projects/{project}/files/content/run.py", headers=headers, timeout=20)
        assert read.text == program
        run = httpx.post(f"{first}/api/projects/{project}/runs", json={"entry": "run.py"}, headers=headers, timeout=20)
        run.raise_for_status()
        assert await follow_run(first, run.json()["id"], cookie) == ("ok", "1\n")  # live: on the worker running it
        record = httpx.get(f"{second}/api/runs/{run.json()['id']}", headers=headers, timeout=20).json()
        assert (record["status"], record["verdict"], record["stdout"]) == ("finished", "ok", "1\n")
        # Over before its socket opened on the other worker (a quick run under load): that worker replays it
        assert await follow_run(second, run.json()["id"], cookie) == ("ok", "1\n")
        # Live through the other worker too, both ways: it relays the socket to the run's worker.
        put = httpx.put(f"{second}/api/projects/{project}/files/content/ask.py",
                        content=b"print(input() + '!')\n", headers=headers, timeout=20)
        put.raise_for_status()
        run = httpx.post(f"{first}/api/projects/{project}/runs", json={"entry": "ask.py", "interactive": True},
                         headers=headers, timeout=20)
        run.raise_for_status()
        assert await follow_run(second, run.json()["id"], cookie, typed="hi\n") == ("ok", "hi!\n")
        # And cancelled through the other worker (it used to answer the run as it was and cancel nothing).
        put = httpx.put(f"{second}/api/projects/{project}/files/content/wait.py",
                        content=b"import time\ntime.sleep(60)\n", headers=headers, timeout=20)
        put.raise_for_status()
        run = httpx.post(f"{first}/api/projects/{project}/runs", json={"entry": "wait.py"}, headers=headers, timeout=20)
        run.raise_for_status()
        httpx.post(f"{second}/api/runs/{run.json()['id']}/cancel", headers=headers, timeout=20).raise_for_status()
        for _ in range(100):
            record = httpx.get(f"{first}/api/runs/{run.json()['id']}", headers=headers, timeout=20).json()
            if record["status"] == "finished":
                break
            await asyncio.sleep(0.1)
        assert record["verdict"] == "cancelled", record

        # A web app's Webview through either worker: its token names the worker running it, the other sends it there
        server = ("import http.server, os\nclass H(http.server.BaseHTTPRequestHandler):\n"
                  "    def do_GET(self):\n        self.send_response(200); self.send_header('Content-Length', '2')\n"
                  "        self.end_headers(); self.wfile.write(b'hi')\n"
                  "http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n")
        httpx.put(f"{second}/api/projects/{project}/files/content/web.py", content=server.encode(), headers=headers,
                  timeout=20).raise_for_status()
        run = httpx.post(f"{first}/api/projects/{project}/runs", json={"entry": "web.py", "interactive": True},
                         headers=headers, timeout=20)
        run.raise_for_status()
        for _ in range(300):
            if (url := httpx.get(f"{first}/api/runs/{run.json()['id']}", headers=headers, timeout=20).json()["preview_url"]):
                break
            await asyncio.sleep(0.1)
        assert url, "the web app never listened"
        for base in (first, second, workers.url):
            answer = httpx.get(f"{base}{url}", timeout=20)
            assert (answer.status_code, answer.text) == (200, "hi"), (base, answer.status_code, answer.text[:200])
        httpx.post(f"{first}/api/runs/{run.json()['id']}/cancel", headers=headers, timeout=20).raise_for_status()

        saved = "print('saved')\n"  # a save while both workers have the file open in an editor
        put = httpx.put(f"{second}/api/projects/{project}/files/content/main.py", content=saved.encode(),
                        headers=headers, timeout=20)
        put.raise_for_status()
        read = httpx.get(f"{first}/api/projects/{project}/files/content/main.py", headers=headers, timeout=20)
        assert read.text == saved
        await converged([one, other], "print('saved')")
        for editor in (one, other):
            await editor.close()

    asyncio.run(scenario())


def test_deploy_calls_reach_the_worker_running_the_apps(workers: Workers) -> None:
    """The apps' owner advertises its own port (the shared one would hand a forwarded call to any worker)."""
    import redis

    owner = json.loads(redis.Redis(unix_socket_path=str(workers.data_dir / "redis.sock")).get(LEASE_KEY) or "null")
    assert owner is not None and f"http://{owner['http']}" in workers.own_urls.values()
    client = httpx.Client(base_url=workers.url, timeout=20)
    client.post("/api/auth/register", json={"username": "deployer", "password": PASSWORD}).raise_for_status()
    csrf = {"X-CSRF-Token": client.cookies["codeyard_csrf"]}
    project = client.post("/api/projects", json={"name": "site", "template": "python"}, headers=csrf).json()["id"]
    for own in workers.own_urls.values():  # the other worker forwards the call to the owner
        answer = httpx.get(f"{own}/api/projects/{project}/deployment", cookies=client.cookies, timeout=20)
        assert (answer.status_code, answer.json()) == (200, None)
    # The apps port: every worker accepts on it (SO_REUSEPORT), and on an apps port of its own, where the
    # others tunnel to the owner's apps (the owner advertises that one)
    assert {int(owner["apps"].rsplit(":", 1)[1])} < set().union(*workers.own_apps.values())
    for pid, own_apps in workers.own_apps.items():
        assert workers.apps_port in {c.laddr.port for c in psutil.Process(pid).net_connections("tcp")}
        for port in [*own_apps, workers.apps_port]:
            answer = httpx.get(f"http://127.0.0.1:{port}/apps/nothing-here/", timeout=20)
            assert (answer.status_code, answer.text) == (404, "No app is deployed here.")


def test_workers_without_redis_server_is_exit_2(tmp_path: Path, monkeypatch, capsys) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CODEYARD_REDIS_URL", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--workers", "2", "--data-dir", str(tmp_path / "data")])
    assert exited.value.code == 2
    assert "--workers needs Redis: install redis-server or set CODEYARD_REDIS_URL" in capsys.readouterr().err
    assert not (tmp_path / "data").exists()  # refused before anything was prepared


def test_the_llm_grpc_port_is_refused_with_workers(tmp_path: Path, monkeypatch, capsys) -> None:
    variable = "CODEYARD_LLM_GRPC_PORT"  # checked against the IDE's accounts, so not handed to a model server
    monkeypatch.setenv(variable, "0")
    monkeypatch.delenv("CODEYARD_LLM_URL", raising=False)
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--workers", "2", "--data-dir", str(tmp_path / "data")])
    assert exited.value.code == 2
    assert variable in capsys.readouterr().err
    assert not (tmp_path / "data").exists()  # refused before anything was prepared


def test_each_project_has_one_rooms_worker() -> None:
    addresses = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003"
    workers = [Settings(worker_addresses=addresses, worker_index=i) for i in range(3)]
    hosts = [[w.rooms_worker(f"project{n}") for w in workers] for n in range(30)]
    assert all(row.count(None) == 1 for row in hosts), hosts  # served by one, relayed there by the others
    assert all(len(set(row) - {None}) == 1 for row in hosts)
    assert {row.index(None) for row in hosts} == {0, 1, 2}  # spread over the workers
    assert Settings().rooms_worker("project0") is None  # a server alone hosts every room
    assert [w.worker_tag for w in workers] == ["00", "01", "02"] and Settings().worker_tag == ""
    assert workers[0].tagged_worker("02abc") == "127.0.0.1:7003" and workers[2].tagged_worker("02abc") is None
    assert workers[0].tagged_worker("x2abc") is None and Settings().tagged_worker("02abc") is None


def test_the_workers_share_one_model_served_beside_them(tmp_path: Path) -> None:
    """One `llm serve` child holds the model for every worker (not a copy each), behind a key of its own;
    each worker still checks who asks; a model server that dies is started again."""
    model = save_tiny_chat_llama(tmp_path / "tiny")
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    settings = {"CODEYARD_WORKERS": "2", "CODEYARD_LLM_EAGER": "1", "CODEYARD_LLM_MODEL": str(model)}
    with codeyard_serve(data_dir, settings) as url:
        found = Workers(url, data_dir)
        while len(found.own_urls) < 2:  # the second worker follows the first
            time.sleep(0.1)
            found = Workers(url, data_dir)
        parent = psutil.Process(found.pids[0]).parent()
        assert parent is not None
        servers = [p for p in parent.children() if "llm" in p.cmdline() and "serve" in p.cmdline()]
        assert len(servers) == 1, [p.cmdline() for p in parent.children()]
        llm_urls = {psutil.Process(pid).environ()["CODEYARD_LLM_URL"] for pid in found.pids}
        assert len(llm_urls) == 1, llm_urls
        port = int(llm_urls.pop().rsplit(":", 1)[1])
        wait_until(lambda: listening(servers[0], port), timeout=60, pause=0.2,  # once the model server has loaded
                   what=f"the model server listening on {port}")
        assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401  # only with the workers' key
        client = httpx.Client(base_url=url, timeout=30)
        joined = client.post("/api/auth/register", json={"username": "asker", "password": PASSWORD})
        client.headers["X-CSRF-Token"] = joined.json()["csrf_token"]
        assert httpx.get(f"{url}/v1/models").status_code == 401  # a worker asks who it is first
        for own in found.own_urls.values():
            assert completes(client, own, model.name)
        servers[0].kill()
        servers[0].wait(10)
        assert completes(client, url, model.name)  # started again on the same port


def listening(process: psutil.Process, port: int) -> bool:
    return any(c.laddr.port == port for c in process.net_connections("tcp") if c.status == psutil.CONN_LISTEN)


def completes(client: httpx.Client, base: str, model: str) -> bool:
    """A completion through `base` with the client's session, waiting out the model's loading (503)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        answer = client.post(f"{base}/v1/completions", json={"model": model, "prompt": "def", "max_tokens": 2})
        if answer.status_code == 200:
            return len(answer.json()["choices"]) == 1
        assert answer.status_code == 503, answer.text
        time.sleep(0.5)
    return False
