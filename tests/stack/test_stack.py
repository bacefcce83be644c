"""The multi-machine stack for real (`make test-stack`, too long for CI): the images built here without a
registry, docker-compose.yml brought up, and every client through the proxy: sign up, edit from two replicas, run
code, install a package and open a shell on the runners, ask the assistant, deploy an app (hosted by a runner) and
reach it, edit a file together from editors on the two replicas; then broken on purpose (a runner killed during
runs, the runner hosting the app killed, an app replica killed under an editor, Redis and PostgreSQL restarted) and
checked to recover by itself. A client meant for one replica is pinned to it by the proxy's cookie, and which replica
answered is checked against the proxy's X-Codeyard-Replica, never assumed.

Needs a Docker engine at DOCKER_HOST with the images (scripts/test-stack.sh starts one and builds them).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from redis import Redis
from stack_kit import PROXY, Editor, User, eventually, stack_answering
from websockets.sync.client import connect as ws_connect

REPO = Path(__file__).resolve().parents[2]
PROJECT = "codeyard-stack-test"
ENV = {"CODEYARD_LLM_DEVICE": "cpu", "RUNNER_SLOTS": "1"}  # one slot per runner: two runs land on both


# Compose v1 by default (Debian bookworm has no v2); CODEYARD_COMPOSE="docker compose" runs the same steps on v2, whose
# container names differ (project-service-1): the steps find containers with `ps -q`, never by name
COMPOSE = os.environ.get("CODEYARD_COMPOSE", "docker-compose").split()


def compose(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([*COMPOSE, "-p", PROJECT, "-f", "docker-compose.yml", *args], cwd=REPO,
                          env={**os.environ, **ENV}, capture_output=True, text=True, check=check, timeout=600)


def container(service: str) -> str:
    return compose("ps", "-q", service).stdout.strip()


def redis() -> Redis:
    """The stack's Redis, from the host (every service is on the host network): quick enough to catch runs under way,
    which `docker exec redis-cli` on a loaded machine was not."""
    return Redis(port=int(os.environ.get("REDIS_PORT", "56790")), decode_responses=True, socket_timeout=10)


def run_streams() -> set[str]:
    """The runs' out streams in Redis (sandbox.backends.dispatch): one per run dispatched lately."""
    with redis() as r:
        return set(r.scan_iter(match="codeyard:run:*:out", count=1000))


def started_on(key: str) -> str | None:
    """The runner that started the run of this out stream, once one has."""
    with redis() as r:
        entries = r.xrange(key, "-", "+", count=1)
    return entries[0][1].get("runner") if entries and entries[0][1].get("t") == "started" else None


def started_since(before: set[str]) -> dict[str, str] | None:
    """{runner: out stream} of the two runs dispatched since `before`, once both have started."""
    hosts = {key: started_on(key) for key in run_streams() - before}
    return {host: key for key, host in hosts.items() if host} if len(hosts) == 2 and all(hosts.values()) else None


def ended(key: str) -> bool:
    """Whether the run of this out stream has its result."""
    with redis() as r:
        return any(fields.get("t") == "result" for _, fields in r.xrevrange(key, "+", "-", count=1))


@pytest.fixture(scope="module")
def stack():
    subprocess.run(["bash", "scripts/stack-secrets.sh"], cwd=REPO, check=True)
    compose("down", "-v", check=False)
    up = compose("up", "-d", check=False)
    assert up.returncode == 0, up.stderr[-3000:]
    try:
        stack_answering(300)
        yield
    finally:
        logs = compose("logs", "--no-color", "--tail", "300", check=False)
        (REPO / "test-artifacts").mkdir(exist_ok=True)
        (REPO / "test-artifacts" / "stack.log").write_text(logs.stdout + logs.stderr)
        compose("down", "-v", check=False)


def test_sign_up_edit_on_two_replicas_run_and_shell(stack):
    alice = User()
    pid = alice.project({"main.py": "print(sum(range(10)))\n"})
    on_one, on_two = alice.on(1), alice.on(2)  # each answer checked to come from its replica
    assert on_one.http.put(f"/api/projects/{pid}/files/content/notes.txt", content=b"from replica 1").status_code in (200, 201)
    assert on_two.http.get(f"/api/projects/{pid}/files/content/notes.txt").text == "from replica 1"
    run = alice.finished(alice.run(pid))
    assert run["verdict"] == "ok" and run["stdout"] == "45\n", run
    installed = alice.http.post(f"/api/projects/{pid}/packages", json={"names": ["six"]}, timeout=300)
    assert installed.status_code == 200, installed.text
    alice.http.put(f"/api/projects/{pid}/files/content/main.py", content=b"import six\nprint(six.__name__)\n")
    assert alice.finished(alice.run(pid))["stdout"] == "six\n"
    ws_url = PROXY.replace("http", "ws") + f"/ws/projects/{pid}/shell?rows=24&cols=80"
    with ws_connect(ws_url, additional_headers={"Authorization": f"Bearer {alice.token}"}) as shell:
        shell.send(json.dumps({"type": "input", "data": "echo $((6*7)) > answer.txt; exit\n"}))
        while (frame := json.loads(shell.recv(timeout=60)))["type"] != "exit":
            pass
    assert frame["verdict"] == "ok"
    assert alice.http.get(f"/api/projects/{pid}/files/content/answer.txt").text == "42\n"
    for runner in ("runner1", "runner2"):  # what the runs left is reaped (each used to leave a zombie bubblewrap)
        states = subprocess.run(["docker", "top", container(runner), "-eo", "stat,comm"], capture_output=True, text=True).stdout
        assert not [line for line in states.splitlines()[1:] if line.startswith("Z")], states


def test_the_assistant_answers_through_the_llm_service(stack):
    alice = User()

    def answer():
        models = alice.http.get("/v1/models")
        assert models.status_code == 200, models.text
        reply = alice.http.post("/v1/chat/completions", json={
            "model": models.json()["data"][0]["id"], "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi"}]})
        assert reply.status_code == 200, reply.text
        return reply.json()["choices"][0]["message"]["content"]

    assert eventually(answer, 300, "the assistant answering")


def test_a_runner_killed_during_runs(stack):
    alice = User()
    # Long enough to kill a runner under it on a loaded machine; the wall limit raised to let it end
    pid = alice.project({"main.py": "import time\nprint('go', flush=True)\ntime.sleep(30)\nprint('done')\n"})
    runner1 = container("runner1")  # looked up first: docker-compose takes seconds to answer on a loaded machine
    before = run_streams()
    runs = [alice.run(pid, limits={"wall_seconds": 60}) for _ in range(2)]  # one slot per runner: one run on each
    started = eventually(lambda: started_since(before), 20, "both started on runners")
    assert sorted(started) == ["runner1", "runner2"], started
    subprocess.run(["docker", "kill", runner1], check=True, capture_output=True)
    try:
        assert not ended(started["runner1"]), ("runner1's run ended before the kill: the step proves nothing",
                                               [{k: alice.http.get(f"/api/runs/{r}").json().get(k)
                                                 for k in ("verdict", "message", "stdout", "stderr")} for r in runs])
        results = [alice.finished(r) for r in runs]
        seen = [(r["verdict"], r["message"], r["stdout"], r["exit_code"], r["signal"], r["stderr"][-500:]) for r in results]
        assert sorted(r["verdict"] for r in results) == ["internal_error", "ok"], seen
        assert all("runner runner1 stopped during the run" in r["message"] for r in results if r["verdict"] != "ok"), seen
        assert [r["stdout"] for r in results if r["verdict"] == "ok"] == ["go\ndone\n"], seen
    finally:  # back whatever happened: the later steps need both runners
        compose("up", "-d", "runner1")
    again = alice.finished(alice.run(pid, limits={"wall_seconds": 60}))
    assert again["verdict"] == "ok"


def app_hosts() -> dict[str, tuple[str, str]]:
    """{runner: (apps it hosts, their CPUs)} from the live runners' heartbeats (sandbox.runner_apps)."""
    with redis() as r:
        beats = {key.removeprefix("codeyard:runner:"): r.hgetall(key) for key in r.scan_iter(match="codeyard:runner:*")}
    return {name: (beat.get("apps", ""), beat.get("app_cpus", "")) for name, beat in beats.items() if beat}


def test_a_deployed_app_runs_on_a_runner_and_comes_back_on_the_other_when_it_dies(stack):
    alice = User()
    pid = alice.project({"index.html": "<h1>served by a runner</h1>\n", "codeyard.toml": "[deploy]\ncpus = 0.5\n"})
    assert alice.http.post(f"/api/projects/{pid}/deployments").status_code == 202
    deployment = eventually(lambda: (d := alice.http.get(f"/api/projects/{pid}/deployment").json())["status"] == "running"
                            and d, 240, "the app live")
    page = f"{PROXY}/apps/{deployment['slug']}/"

    def answers() -> bool:
        response = httpx.get(page, timeout=10)
        return response.status_code == 200 and "served by a runner" in response.text

    eventually(answers, 60, "the app answering through the proxy")
    hosts = {name: load for name, load in app_hosts().items() if load[0] == "1"}
    assert len(hosts) == 1 and next(iter(hosts.values()))[1] == "0.5", app_hosts()  # one runner hosts it, 0.5 CPU
    dead = next(iter(hosts))
    subprocess.run(["docker", "kill", container(dead)], check=True, capture_output=True)
    other = eventually(lambda: [n for n, load in app_hosts().items() if load[0] == "1" and n != dead], 120,
                       "the app hosted by the other runner")
    assert other == [{"runner1": "runner2", "runner2": "runner1"}[dead]], app_hosts()
    eventually(answers, 60, "the app answering again, from the other runner")
    compose("up", "-d", dead)


NOTES = "# notes\n"


async def edit_on_two_replicas_and_kill_one(alice: User, pid: str) -> str:
    """Two editors on notes.md through the proxy, pinned one to each replica, see each other's lines; replica 1 is
    killed under its editor, which reconnects through the proxy with the same pin, lands on the replica left and types
    on. What both show at the end."""
    on_one, on_two = Editor(alice, pid, "notes.md", replica=1), Editor(alice, pid, "notes.md", replica=2)
    assert await on_one.open() == 1
    assert await on_two.open() == 2
    await on_one.shows(NOTES)
    await on_two.shows(NOTES)
    await on_one.append("one\n")
    await on_two.shows(NOTES + "one\n")  # acknowledged: it reached the editor on the other replica
    await on_two.append("two\n")
    await on_one.shows(NOTES + "one\ntwo\n")
    await on_one.append("typed as it died\n")  # perhaps never stored by replica 1: its editor sends it again
    await asyncio.to_thread(subprocess.run, ["docker", "kill", container("app1")], check=True, capture_output=True)
    await on_one.dropped()
    assert await on_one.open() == 2  # its replica down, the proxy passed it to the other
    await on_two.shows(NOTES + "one\ntwo\ntyped as it died\n")
    await on_one.append("three\n")
    text = NOTES + "one\ntwo\ntyped as it died\nthree\n"
    await on_one.shows(text)
    await on_two.shows(text)
    for editor in (on_one, on_two):
        await editor.close()
    return text


def test_two_editors_on_two_replicas_and_an_app_replica_killed(stack):
    alice = User()
    pid = alice.project({"a.txt": "kept", "notes.md": NOTES})
    text = asyncio.run(edit_on_two_replicas_and_kill_one(alice, pid))
    for _ in range(10):  # the proxy passes over the dead replica
        assert alice.http.get(f"/api/projects/{pid}/files/content/a.txt").text == "kept"
    eventually(lambda: alice.http.get(f"/api/projects/{pid}/files/content/notes.md").text == text, 60,
               "the edits written to the file by the replica left")
    compose("up", "-d", "app1")
    # Through the proxy, pinned to replica 1: answered by replica 2 until replica 1 is back and the proxy tries it again
    pinned = alice.on(1)
    eventually(lambda: pinned.http.get("/readyz").status_code == 200, 120, "replica 1 back behind the proxy")

    async def reopened_on_replica_one() -> None:
        editor = Editor(alice, pid, "notes.md", replica=1)
        assert await editor.open() == 1
        await editor.shows(text)
        await editor.close()

    asyncio.run(reopened_on_replica_one())


def test_redis_and_postgres_restarted(stack):
    compose("restart", "redis", "postgres")

    def works():
        user = User()
        run = user.finished(user.run(user.project({"main.py": "print('back')\n"})))
        return run["stdout"] == "back\n"

    assert eventually(works, 120, "the stack recovering after Redis and PostgreSQL restarted")
