"""One-click deploys: build, run, health-check, route, roll back (issue 6).

HTTP API (JSON; errors are {"detail": message}; access through ide_server.deps):

    POST   /api/projects/{id}/deployments            editor  -> 202 DeploymentPublic (a new release, "building")
    GET    /api/projects/{id}/deployment             member  -> DeploymentPublic (404 if never deployed)
    POST   /api/projects/{id}/deployment/rollback    editor  {"release_id": str} -> 202 DeploymentPublic
    POST   /api/projects/{id}/deployment/scale       editor  {"instances": int 1..4} -> DeploymentPublic
    POST   /api/projects/{id}/deployment/stop        editor  -> DeploymentPublic (status "stopped")
    DELETE /api/projects/{id}/deployment             owner   -> 204 (app stopped, releases and logs removed)
    WS     /ws/projects/{id}/deployment/logs         editor  frames {"type": "log", "release": str|null,
           "stream": "build"|"stdout"|"stderr"|"system", "data": str, "time": float}; the kept tail first.
    ANY    /apps/{slug}/{path}                       public  the app itself (HTTP, streaming, WebSockets);
           also http://{slug}.apps.<host>/ when CODEYARD_DEPLOY_APPS_HOST=<host> is set, and both on the apps'
           own port when CODEYARD_DEPLOY_APPS_PORT is. 404: no such app; 503 (Retry-After): stopped, or no
           healthy instance (restarting); 502: the app did not answer; 504: nor within 300 s.

DeploymentPublic = {"slug", "url", "status": "deploying"|"running"|"unhealthy"|"stopped"|"failed",
    "instances": int, "healthy_instances": int, "current_release": ReleasePublic|null,
    "releases": [ReleasePublic, newest first]}
ReleasePublic = {"id", "number", "status": "building"|"starting"|"live"|"retired"|"failed", "kind":
    "flask"|"fastapi"|"node"|"static"|"custom"|null, "message", "can_roll_back": bool,
    "created_at", "finished_at"}
A failed release's "message" says why, with the tail of its log; "retired" ones served before.

Modules: detect (app kind, codeyard.toml [deploy]), instance (one sandboxed copy behind a unix
socket), upstream (HTTP/1.1 to an instance), proxy (the /apps gateway on the IDE's port), edge (the
apps' own port), logs (kept and followed),
service (the rules: roll out, switch, drain, roll back, scale, restart, restore), component (API).
"""
