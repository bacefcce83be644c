"""The runs API, package installs and the Shell with CODEYARD_SANDBOX_BACKEND=runners: the app queues runs on
Redis and a `codeyard runner` process (sharing the app's data and packages folders, as compose's runners share
the volume) runs them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from api_people import sign_up
from conftest import COMPONENTS, new_project, wait_finished
from ide_server.app import create_app
from ide_server.settings import Settings
from sandbox.dispatch import heartbeat_key


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The app on the runners backend, one runner beside it, and a Redis server of their own."""
    root = tmp_path_factory.mktemp("runners")
    data_dir, sock = root / "data", root / "redis.sock"
    data_dir.mkdir()
    packages_dir = Path(tempfile.mkdtemp(prefix="codeyard-packages-test-"))  # sandbox uids reach it (tmp_path: 0700)
    os.chmod(packages_dir, 0o711)
    redis_server = subprocess.Popen(["redis-server", "--port", "0", "--unixsocket", str(sock), "--save", "",
                                     "--appendonly", "no", "--dir", str(root)], stdout=subprocess.DEVNULL)
    while not sock.exists():
        time.sleep(0.05)
    url = f"unix://{sock}"
    env = {**os.environ, "CODEYARD_REDIS_URL": url, "CODEYARD_DATA_DIR": str(data_dir), "CODEYARD_SANDBOX_BACKEND": "bwrap",
           "CODEYARD_PACKAGES_DIR": str(packages_dir)}
    runner = subprocess.Popen([str(Path(sys.executable).with_name("codeyard")), "runner", "--name", "api-runner"], env=env,
                              stdout=open(root / "runner.log", "wb"), stderr=subprocess.STDOUT)
    client = redis.Redis(unix_socket_path=str(sock))
    while not client.exists(heartbeat_key("api-runner")):
        assert runner.poll() is None, (root / "runner.log").read_text()
        time.sleep(0.05)
    application = create_app(Settings(data_dir=data_dir, database_url=f"sqlite:///{data_dir / 'codeyard.db'}",
                                      sandbox_backend="runners", redis_url=url, packages_dir=packages_dir,
                                      log_level="warning"),
                             component_specs=COMPONENTS)
    with TestClient(application) as test_client:
        yield test_client
    application.state.engine.dispose()
    runner.terminate()
    assert runner.wait(30) == 0
    assert not client.exists(heartbeat_key("api-runner"))  # drained and gone
    redis_server.terminate()
    redis_server.wait(10)
    shutil.rmtree(packages_dir)


@pytest.fixture
def owner(served):
    return sign_up(served)


def test_a_run_through_the_api_runs_on_the_runner(owner):
    pid = new_project(owner, {"main.py": "print(input().upper())\nopen('made.txt', 'w').write('by the runner')\n"})
    started = owner.post(f"/api/projects/{pid}/runs", json={"stdin": "hello\n"})
    assert started.status_code == 202, started.text
    run = wait_finished(owner, started.json()["id"])
    assert run["verdict"] == "ok", run["message"]
    assert run["stdout"] == "HELLO\n" and run["files_written"] == ["made.txt"]
    assert owner.get(f"/api/projects/{pid}/files/content/made.txt").text == "by the runner"


def test_the_shell_runs_on_the_runner(owner):
    pid = new_project(owner, {})
    with owner.websocket_connect(f"/ws/projects/{pid}/shell?rows=30&cols=100") as ws:
        seen = ""
        ws.send_json({"type": "input", "data": "stty size; echo $((6*7)) > answer.txt; exit\n"})
        while (frame := ws.receive_json())["type"] != "exit":
            seen += frame.get("data", "")
        assert "30 100" in seen and frame["verdict"] == "ok"
    assert owner.get(f"/api/projects/{pid}/files/content/answer.txt").text == "42\n"


def test_a_package_installs_on_the_runner_and_runs_import_it(owner):
    pid = new_project(owner, {"main.py": "import six\nprint(six.__name__)\n"})
    answer = owner.post(f"/api/projects/{pid}/packages", json={"names": ["six"]})
    assert answer.status_code == 200, answer.text
    assert answer.json()["requirements"] == [f"six=={answer.json()['installed']['six']}"]
    run = wait_finished(owner, owner.post(f"/api/projects/{pid}/runs", json={}).json()["id"])
    assert run["verdict"] == "ok" and run["stdout"] == "six\n", run
