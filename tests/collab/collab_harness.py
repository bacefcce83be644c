"""A minimal ASGI app serving collab rooms the way ide_server will, for tests and the benchmark.

Run: COLLAB_DB_URL=... COLLAB_ROOT=... [COLLAB_REDIS_URL=...] uvicorn --app-dir tests/collab
collab_harness:create_app --factory. A token is "<COLLAB_SECRET>:<user>:<role>" (role editor or
viewer); the real app authenticates with its session cookie or API token instead.
"""

from __future__ import annotations

import os
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, WebSocket

from collab.fanout import Fanout
from collab.room import RoomKey
from collab.rooms import RoomManager
from collab.store import UpdateStore
from collab.websocket import serve_websocket
from ide_server.db import make_engine, migrate

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


def resolve_under(root: Path, key: RoomKey) -> Path:
    """The file for key inside root; ValueError if the path would leave the project."""
    project = (root / key.project_id).resolve()
    path = (project / key.file_path).resolve()
    if not path.is_relative_to(project) or path == project:
        raise ValueError(f"file_path: {key.file_path!r} is outside the project")
    return path


def create_app() -> FastAPI:
    root = Path(os.environ["COLLAB_ROOT"])
    secret = os.environ.get("COLLAB_SECRET", "test-secret")
    engine = make_engine(os.environ["COLLAB_DB_URL"])
    migrate(engine)  # no-op when the tests' database is already at head
    fanout = Fanout(os.environ["COLLAB_REDIS_URL"]) if os.environ.get("COLLAB_REDIS_URL") else None
    manager = RoomManager(
        UpdateStore(engine),
        lambda key: resolve_under(root, key),
        fanout=fanout,
        idle_unload_s=float(os.environ.get("COLLAB_IDLE_UNLOAD_S", "30")),
        compact_every=int(os.environ.get("COLLAB_COMPACT_EVERY", "500")),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        yield
        await manager.shutdown()
        if fanout:
            await fanout.close()
        engine.dispose()

    app = FastAPI(lifespan=lifespan)

    @app.websocket("/ws/collab/{project_id}/{file_path:path}")
    async def collab_socket(websocket: WebSocket, project_id: str, file_path: str) -> None:
        await websocket.accept()
        parts = websocket.query_params.get("token", "").split(":")
        if len(parts) != 3 or parts[0] != secret:
            await websocket.close(CLOSE_UNAUTHENTICATED, "not signed in")
            return
        _, user_id, role = parts
        if role not in ("editor", "viewer"):
            await websocket.close(CLOSE_FORBIDDEN, "no access to this project")
            return
        key = RoomKey(project_id, file_path)
        try:
            resolve_under(root, key)
        except ValueError as exc:
            await websocket.close(CLOSE_FORBIDDEN, str(exc)[:120])
            return
        await serve_websocket(websocket, manager, key, can_write=role == "editor", user_id=user_id)

    @app.post("/test/set-text/{project_id}/{file_path:path}")
    async def set_text(project_id: str, file_path: str, body: dict) -> dict:
        await manager.set_text(RoomKey(project_id, file_path), body["text"])
        return {"ok": True}

    @app.post("/test/revoke/{project_id}/{user_id}")
    async def revoke(project_id: str, user_id: str) -> dict:
        await manager.close_user(project_id, user_id)
        return {"ok": True}

    @app.get("/test/rooms")
    async def rooms() -> dict:
        return {
            "rooms": {
                key.name: {"peers": len(room.peers), "text": str(room.text)}
                for key, room in manager.rooms.items()
            }
        }

    return app
