"""Who may do what with a deployment, its logs WebSocket, codeyard.toml builds, and host-name routing."""

from __future__ import annotations

import pytest
from starlette.websockets import WebSocketDisconnect

from deploy.conftest import add_member, deploy, new_project, write_files

SITE = {"index.html": "<p>mine</p>\n"}


def test_another_users_app_cannot_be_read_stopped_or_reconfigured(owner, person):
    project_id = new_project(owner, SITE)
    first = deploy(owner, project_id)
    release_id = first["current_release"]["id"]
    stranger, viewer, editor = person(), person(), person()
    add_member(owner, project_id, viewer, "viewer")
    add_member(owner, project_id, editor, "editor")
    base = f"/api/projects/{project_id}"
    calls = [("POST", f"{base}/deployments", None), ("POST", f"{base}/deployment/rollback", {"release_id": release_id}),
             ("POST", f"{base}/deployment/scale", {"instances": 2}), ("POST", f"{base}/deployment/stop", None),
             ("DELETE", f"{base}/deployment", None)]
    assert stranger.get(f"{base}/deployment").status_code == 404
    for method, url, body in calls:
        assert stranger.request(method, url, json=body).status_code == 404, url
        assert viewer.request(method, url, json=body).status_code == 403, url
    assert viewer.get(f"{base}/deployment").json()["slug"] == first["slug"]
    assert editor.delete(f"{base}/deployment").status_code == 403  # only the owner deletes
    deployment = owner.get(f"{base}/deployment").json()
    assert deployment["status"] == "running" and deployment["instances"] == 1
    assert deployment["current_release"]["id"] == release_id and len(deployment["releases"]) == 1
    assert owner.client.get(first["url"]).text == "<p>mine</p>\n"
    for who, code in ((stranger, 4404), (viewer, 4403)):  # the logs are the editors' (an app may print secrets)
        with pytest.raises(WebSocketDisconnect) as closed:
            with who.websocket_connect(f"/ws/projects/{project_id}/deployment/logs") as socket:
                socket.receive_json()
        assert closed.value.code == code
    with editor.websocket_connect(f"/ws/projects/{project_id}/deployment/logs") as socket:
        assert socket.receive_json()["type"] == "log"


def test_logs_stream_build_and_runtime_output(owner):
    files = {
        "build.py": "open('built.txt', 'w').write('made by the build')\nprint('building now')\n",
        "app.py": "import http.server, os\nprint('app starting on', os.environ['PORT'], flush=True)\n"
                  "http.server.test(http.server.SimpleHTTPRequestHandler, http.server.ThreadingHTTPServer, "
                  "port=int(os.environ['PORT']), bind='127.0.0.1')\n",
        "codeyard.toml": '[deploy]\nbuild = "python3 build.py"\nrun = ["python3", "app.py"]\n',
    }
    project_id = new_project(owner, files)
    deployment = deploy(owner, project_id)
    assert deployment["status"] == "running", deployment["releases"][0]["message"]
    assert deployment["current_release"]["kind"] == "custom"
    assert owner.client.get(f"{deployment['url']}built.txt").text == "made by the build"
    with owner.websocket_connect(f"/ws/projects/{project_id}/deployment/logs") as socket:
        entries = []
        while not any("GET /built.txt" in e["data"] for e in entries):
            entries.append(socket.receive_json())
    streams = {(e["stream"], e["data"].strip()) for e in entries}
    assert ("build", "building now") in streams
    assert ("stdout", "app starting on 8080") in streams
    assert any(e["stream"] == "system" and "is live" in e["data"] for e in entries)
    assert all(e["release"] == deployment["current_release"]["id"] for e in entries)


def test_bad_deploy_settings_fail_with_the_field_named(owner):
    project_id = new_project(owner, {**SITE, "codeyard.toml": "[deploy]\ninstances = 50\n"})
    deployment = deploy(owner, project_id)
    assert deployment["status"] == "failed"
    assert "deploy.instances must be a whole number from 1 to 4" in deployment["releases"][0]["message"]
    write_files(owner, project_id, {"codeyard.toml": "[deploy]\nmemory_mb = 4096\n"})
    assert "deploy.memory_mb must be a whole number from 32 to 1024" in deploy(owner, project_id)["releases"][0]["message"]
    assert owner.post(f"/api/projects/{project_id}/deployment/rollback", json={"release_id": "nope"}).status_code == 400
    assert owner.post(f"/api/projects/{project_id}/deployment/scale", json={"instances": 0}).status_code == 422


def test_apps_answer_on_their_own_host_name_when_configured(owner, served):
    project_id = new_project(owner, SITE)
    slug = deploy(owner, project_id)["slug"]
    deploys = served.app.state.services.deploys
    deploys.apps_host = "codeyard.test"
    try:
        assert owner.get(f"/api/projects/{project_id}/deployment").json()["url"] == f"http://{slug}.apps.codeyard.test/"
        page = served.get("/", headers={"Host": f"{slug}.apps.codeyard.test"})
        assert page.text == "<p>mine</p>\n"
        assert "content-security-policy" not in page.headers  # its own origin: no sandbox needed
        assert served.get("/", headers={"Host": "other.apps.codeyard.test"}).status_code == 404
    finally:
        deploys.apps_host = None
    assert served.get("/healthz").status_code == 200  # the IDE itself is untouched


SECRET_APP = '''
import hashlib, http.server, os

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = hashlib.sha256(os.environ.get("API_TOKEN", "").encode()).hexdigest().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

http.server.ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
'''


def test_secrets_reach_the_app_and_never_its_logs_or_the_api(owner):
    import hashlib

    value = "s3cr3t-deploy-value-42"
    project_id = new_project(owner, {"server.py": SECRET_APP, "codeyard.toml": '[deploy]\nrun = "python3 server.py"\n'})
    assert owner.put(f"/api/projects/{project_id}/secrets/API_TOKEN", json={"value": value}).status_code in (200, 201)
    deployment = deploy(owner, project_id)
    assert deployment["status"] == "running", deployment["releases"][0]["message"]
    assert owner.client.get(deployment["url"]).text == hashlib.sha256(value.encode()).hexdigest()
    assert value not in owner.get(f"/api/projects/{project_id}/deployment").text
    with owner.websocket_connect(f"/ws/projects/{project_id}/deployment/logs") as socket:
        entries = []
        while not any("is live" in e["data"] for e in entries):
            entries.append(socket.receive_json())
    assert value not in str(entries)


def test_deploys_pile_up_no_further_than_three(owner):
    project_id = new_project(owner, {"app.py": "print('no server here')\n",
                                     "codeyard.toml": '[deploy]\nbuild = "sleep 3"\nrun = "python3 app.py"\n'})
    answers = [owner.post(f"/api/projects/{project_id}/deployments") for _ in range(4)]
    assert [a.status_code for a in answers] == [202, 202, 202, 409]
    assert "already under way" in answers[3].json()["detail"]


HUNGRY_APP = """
import http.server, os
hoard = bytearray(int(os.environ.get("HOARD_MB", "0")) * 1024 * 1024)  # touched: really resident
for i in range(0, len(hoard), 4096):
    hoard[i] = 1
http.server.test(http.server.SimpleHTTPRequestHandler, http.server.ThreadingHTTPServer,
                 port=int(os.environ["PORT"]), bind="127.0.0.1")
"""


def test_an_app_gets_the_memory_its_codeyard_toml_asks_for(owner):
    def deploy_with(memory_mb: int) -> dict:
        config = f'[deploy]\nrun = ["/bin/sh", "-c", "HOARD_MB=120 exec python3 app.py"]\nmemory_mb = {memory_mb}\n'
        write_files(owner, project_id, {"app.py": HUNGRY_APP, "codeyard.toml": config})
        return deploy(owner, project_id)

    project_id = new_project(owner, SITE)
    starved = deploy_with(64)
    assert starved["releases"][0]["status"] == "failed"
    assert "exited (signal 9)" in starved["releases"][0]["message"]  # the kernel's OOM killer, inside its cgroup
    fed = deploy_with(256)
    assert fed["status"] == "running", fed["releases"][0]["message"]
