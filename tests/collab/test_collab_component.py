"""The collab component inside the real ide_server app: accounts, roles and the files on disk."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from collab_testkit import CollabServer, cookie_header, signed_in
from pycrdt import Doc, Text
from waiting import wait_until
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from collab.protocol import SyncStep2, SyncUpdate, decode_message, encode_sync_step1, encode_sync_update


class PyEditor:
    """A y-websocket client on pycrdt over a real websocket."""

    def __init__(self, ws) -> None:
        self.ws = ws
        self.doc = Doc()
        self.text = self.doc.get("content", type=Text)

    async def sync(self) -> None:
        await self.ws.send(encode_sync_step1(self.doc.get_state()))
        while not isinstance(message := decode_message(await self.ws.recv()), SyncStep2):
            pass
        self.doc.apply_update(message.update)

    async def insert(self, index: int, piece: str) -> None:
        before = self.doc.get_state()
        self.text.insert(index, piece)
        await self.ws.send(encode_sync_update(self.doc.get_update(before)))

    async def next_update(self) -> None:
        while not isinstance(message := decode_message(await self.ws.recv()), SyncUpdate):
            pass
        self.doc.apply_update(message.update)


async def close_code(url: str, headers: dict[str, str]) -> int:
    async with connect(url, additional_headers=headers) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                await ws.recv()
    return closed.value.rcvd.code


async def test_sign_in_and_roles_decide_who_may_edit(app_server: CollabServer, tmp_path: Path) -> None:
    owner = signed_in(app_server)
    pid = owner.post("/api/projects", json={"name": "pair"}).json()["id"]
    assert owner.put(f"/api/projects/{pid}/files/content/notes.md", content="hi 😀\n".encode()).status_code == 200
    url = f"{app_server.ws_url}/ws/collab/{pid}/notes.md"

    assert await close_code(url, {}) == 4401
    assert await close_code(url, cookie_header(signed_in(app_server))) == 4403
    assert await close_code(f"{app_server.ws_url}/ws/collab/{pid}/%2E%2E/x.md", cookie_header(owner)) == 4403

    viewer = signed_in(app_server)
    token = owner.post(f"/api/projects/{pid}/invites", json={"role": "viewer"}).json()["token"]
    assert viewer.post(f"/api/invites/{token}/accept").status_code == 200

    async with connect(url, additional_headers=cookie_header(owner)) as owner_ws, \
            connect(url, additional_headers=cookie_header(viewer)) as viewer_ws:
        editing, watching = PyEditor(owner_ws), PyEditor(viewer_ws)
        await editing.sync()
        await watching.sync()
        assert str(editing.text) == str(watching.text) == "hi 😀\n"
        await watching.insert(0, "VANDAL ")  # refused by the server
        await editing.insert(0, "owner ")
        await asyncio.wait_for(watching.next_update(), 5)
        assert str(watching.text).count("owner ") == 1

    path = tmp_path / "data" / "projects" / pid / "notes.md"
    wait_until(lambda: path.read_text(encoding="utf-8") == "owner hi 😀\n", 2)
