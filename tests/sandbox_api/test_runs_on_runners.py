"""The runs API, package installs and the Shell with CODEYARD_SANDBOX_BACKEND=runners: the app queues runs on
Redis and a `codeyard runner` process (sharing the app's data and packages folders, as compose's runners share
the volume) runs them; and a replica that is its own runner (CODEYARD_RUNNER_SLOTS) through the same path."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis
from api_people import sign_up
from conftest import COMPONENTS, new_project, wait_finished
from fastapi.testclient import TestClient
from redis_server import RedisServer

from ide_server.app import create_app
from ide_server.settings import Settings
from sandbox.backends.dispatch import heartbeat_key


@contextmanager
def app_on_runners(root: Path, runner_slots: int = 0):
    """The app on the runners backend with a Redis server of its own; yields (client, redis URL, settings)."""
    server = RedisServer(root).start()
    data_dir = root / "data"
    data_dir.mkdir()
    packages_dir = Path(tempfile.mkdtemp(prefix="codeyard-packages-test-"))  # sandbox uids reach it (tmp_path: 0700)
    os.chmod(packages_dir, 0o711)
    settings = Settings(data_dir=data_dir, database_url=f"sqlite:///{data_dir / 'codeyard.db'}", sandbox_backend="runners",
                        redis_url=server.url, packages_dir=packages_dir, runner_slots=runner_slots, log_level="warning")
    application = create_app(settings, component_specs=COMPONENTS)
    try:
        with TestClient(application) as client:
            yield client, server.url, settings
        application.state.engine.dispose()
    finally:
        server.kill()
        shutil.rmtree(packages_dir)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The app, and one `codeyard runner` process beside it."""
    root = tmp_path_factory.mktemp("runners")
    with app_on_runners(root) as (client, url, settings):
        env = {**os.environ, "CODEYARD_REDIS_URL": url, "CODEYARD_DATA_DIR": str(settings.data_dir),
               "CODEYARD_SANDBOX_BACKEND": "bwrap", "CODEYARD_PACKAGES_DIR": str(settings.packages_dir)}
        runner = subprocess.Popen([str(Path(sys.executable).with_name("codeyard")), "runner", "--name", "api-runner"],
                                  env=env, stdout=open(root / "runner.log", "wb"), stderr=subprocess.STDOUT)
        redis_client = redis.Redis.from_url(url)
        while not redis_client.exists(heartbeat_key("api-runner")):
            assert runner.poll() is None, (root / "runner.log").read_text()
            time.sleep(0.05)
        yield client
        runner.terminate()
        assert runner.wait(30) == 0
        assert not redis_client.exists(heartbeat_key("api-runner"))  # drained and gone


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


def test_a_replica_with_runner_slots_is_its_own_runner(tmp_path):
    with app_on_runners(tmp_path, runner_slots=2) as (client, url, _):
        alone = sign_up(client)
        pid = new_project(alone, {"main.py": "print('here')\n"})
        run = wait_finished(alone, alone.post(f"/api/projects/{pid}/runs", json={}).json()["id"])
        assert run["verdict"] == "ok" and run["stdout"] == "here\n", run
        assert [key.decode() for key in redis.Redis.from_url(url).keys("codeyard:runner:*")][0].endswith("-replica")
