"""Two `codeyard serve` replicas on one PostgreSQL database, one Redis and one data dir (as compose runs
them): one runs the apps, the other forwards deploy calls and app traffic to it and follows the logs
from the shared files; when the first stops, the second brings every deployment back."""

from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import redis
from serve_process import codeyard_serve, free_port
from sqlalchemy import create_engine, make_url, text
from waiting import wait_until
from websockets.sync.client import connect

from deploy.conftest import packages_dir
from deploy_service.owner import LEASE_KEY

APP = 'from flask import Flask\napp = Flask(__name__)\n\n@app.get("/")\ndef home():\n    print("served a visitor", flush=True)\n    return "one app, {version}"\n'
REDIS_DB = 9  # this test's own, emptied first: the lease key is the server's fixed one


@pytest.fixture
def shared_settings(tmp_path) -> Iterator[dict[str, str]]:
    """What the replicas share: a fresh PostgreSQL database, a Redis database, a data dir, a package cache."""
    base_url = os.environ.get("CODEYARD_TEST_POSTGRES_URL")
    redis_base = os.environ.get("CODEYARD_TEST_REDIS_URL")
    if not base_url or not redis_base:
        pytest.fail("run the tests through scripts/run-tests.sh (PostgreSQL and Redis)")
    name = f"codeyard_replicas_{secrets.token_hex(4)}"
    admin = create_engine(make_url(base_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    redis_url = redis_base.rsplit("/", 1)[0] + f"/{REDIS_DB}"
    redis.from_url(redis_url).flushdb()
    runs = Path(tempfile.mkdtemp(prefix="codeyard-replica-runs-"))  # their app sockets, apart from this session's
    try:
        yield {"CODEYARD_DATABASE_URL": make_url(base_url).set(database=name).render_as_string(hide_password=False),
               "CODEYARD_REDIS_URL": redis_url, "CODEYARD_PACKAGES_DIR": str(packages_dir()),
               "CODEYARD_SANDBOX_DIR": str(runs), "CODEYARD_LOG_LEVEL": "info"}
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        redis.from_url(redis_url).flushdb()


def start_replica(stack: ExitStack, data_dir: Path, shared: dict[str, str], name: str) -> tuple[str, str]:
    """(IDE base URL, apps base URL) of a new replica."""
    apps_port = free_port()
    base = stack.enter_context(codeyard_serve(data_dir, {**shared, "CODEYARD_DEPLOY_APPS_PORT": str(apps_port)},
                                              log_name=f"{name}.log"))
    return base, f"http://127.0.0.1:{apps_port}"


def owner_apps_address(shared: dict[str, str]) -> str | None:
    raw = redis.from_url(shared["CODEYARD_REDIS_URL"]).get(LEASE_KEY)
    return json.loads(raw)["apps"] if raw else None


def test_two_replicas_share_the_apps_and_hand_them_over(tmp_path, shared_settings):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with ExitStack() as first_stack, ExitStack() as second_stack:
        first, first_apps = start_replica(first_stack, data_dir, shared_settings, "first")
        wait_until(lambda: owner_apps_address(shared_settings) == first_apps.removeprefix("http://"), timeout=20)
        second, second_apps = start_replica(second_stack, data_dir, shared_settings, "second")

        # A user of the second replica deploys: the call goes on to the first, which runs the app.
        user = httpx.Client(base_url=second, timeout=60)
        csrf = user.post("/api/auth/register", json={"username": "two", "password": "pass-word-1"}).json()["csrf_token"]
        user.headers["X-CSRF-Token"] = csrf
        project_id = user.post("/api/projects", json={"name": "replicated"}).json()["id"]
        user.put(f"/api/projects/{project_id}/files/content/app.py", content=APP.replace("{version}", "v1").encode())
        assert user.post(f"/api/projects/{project_id}/deployments").status_code == 202
        deployment = wait_until(lambda: (d := user.get(f"/api/projects/{project_id}/deployment").json())
                                ["status"] in ("running", "failed") and d, timeout=120)
        assert deployment["status"] == "running", deployment["releases"][0]["message"]
        assert deployment["healthy_instances"] == 1  # as the replica running it counts
        url = deployment["url"]
        for door in (first, second, first_apps, second_apps):
            assert httpx.get(door + url, timeout=30).text == "one app, v1"

        # The second replica follows the log the first writes, from the shared data dir.
        cookie = f"codeyard_session={user.cookies['codeyard_session']}"
        with connect(f"ws://{second.removeprefix('http://')}/ws/projects/{project_id}/deployment/logs",
                     additional_headers={"Cookie": cookie}, origin=second) as logs:
            seen = ""
            httpx.get(second_apps + url, timeout=30)  # the app prints a line now
            deadline = time.monotonic() + 20
            while "served a visitor" not in seen:
                assert time.monotonic() < deadline, f"no live log line in: {seen[-500:]}"
                seen += json.loads(logs.recv(timeout=20))["data"]

        # The first replica stops: the second takes the apps over and brings the deployment back.
        first_stack.close()
        wait_until(lambda: owner_apps_address(shared_settings) == second_apps.removeprefix("http://"), timeout=20)
        back = wait_until(lambda: (d := user.get(f"/api/projects/{project_id}/deployment").json())
                          ["healthy_instances"] == 1 and d, timeout=60)
        assert back["status"] == "running" and back["current_release"]["id"] == deployment["current_release"]["id"]
        for door in (second, second_apps):
            assert httpx.get(door + url, timeout=30).text == "one app, v1"

        # And deploys go on there.
        user.put(f"/api/projects/{project_id}/files/content/app.py", content=APP.replace("{version}", "v2").encode())
        assert user.post(f"/api/projects/{project_id}/deployments").status_code == 202
        wait_until(lambda: httpx.get(second_apps + url, timeout=30).text == "one app, v2", timeout=120)
