"""Two app replicas on one database and a real redis-server: a member removed through one replica loses
at once the Webview and the run socket they hold open on the other (where the run runs), as on one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from api_people import Person, sign_up
from conftest import add_member, new_project
from fastapi.testclient import TestClient
from redis_server import RedisServer
from test_run_sockets import closed_with
from test_webview import SERVER, serving

from ide_server.app import create_app
from ide_server.settings import Settings

# The replica that takes the removal: accounts, projects and the events hub, no sandbox.
OTHER_REPLICA = ["ide_server.api.health:component", "ide_server.api.accounts:component",
                 "ide_server.api.projects:component", "ide_server.api.events:component"]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory) -> Iterator[tuple[TestClient, TestClient]]:
    """(the replica that runs programs and serves their Webviews, another one), sharing data and Redis."""
    folder = tmp_path_factory.mktemp("replicas")
    redis = RedisServer(folder).start()
    data = folder / "data"
    settings = {"data_dir": data, "database_url": f"sqlite:///{data / 'codeyard.db'}", "sandbox_backend": "bwrap",
                "log_level": "warning", "redis_url": redis.url}
    runs = create_app(Settings(**settings), component_specs=[*OTHER_REPLICA, "ide_server.api.files:component",
                                                             "sandbox.api:component", "deploy_service.api.deployments:component"])
    other = create_app(Settings(**settings), component_specs=OTHER_REPLICA)
    try:
        with TestClient(runs) as on_runs, TestClient(other) as on_other:
            yield on_runs, on_other
    finally:
        runs.state.engine.dispose()
        other.state.engine.dispose()
        redis.kill()


@pytest.mark.timeout(120)  # a socket left open would block its read forever
def test_a_member_removed_on_another_replica_loses_the_open_webview(replicas) -> None:
    on_runs, on_other = replicas
    owner, leaving, staying = sign_up(on_runs), sign_up(on_runs), sign_up(on_runs)
    pid = new_project(owner, {"main.py": SERVER})
    run = owner.post(f"/api/projects/{pid}/runs", json={"interactive": True}).json()
    add_member(owner, pid, leaving, "editor")
    add_member(owner, pid, staying, "viewer")
    theirs, kept = serving(leaving, run["id"])["preview_url"], serving(staying, run["id"])["preview_url"]
    with leaving.websocket_connect(theirs + "echo") as preview_ws, \
            leaving.websocket_connect(f"/ws/runs/{run['id']}") as run_ws:
        preview_ws.send_text("ping")
        assert preview_ws.receive_text() == "PING"
        removal = Person(on_other, owner.token).delete(f"/api/projects/{pid}/members/{leaving.username}")
        assert removal.status_code == 204
        assert closed_with(preview_ws) == 4403
        assert closed_with(run_ws) == 4403
    assert on_runs.get(theirs + "a").status_code == 404
    assert on_runs.get(kept + "b").text == f"path=/b prefix={kept.rstrip('/')}"  # the others keep theirs
    owner.post(f"/api/runs/{run['id']}/cancel")
