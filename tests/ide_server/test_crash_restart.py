"""SIGKILL the server (one process, or `serve --workers` whole) while a class saves, start it again:
nothing acknowledged is lost (issue 25).

Thirty students save `main.py` through the files API over and over (ten with the editor open on it,
so saves also go through collab rooms) and some have a run going, when the server is killed. After
each restart: every student's file holds their last acknowledged save (or a later one whose answer
the kill swallowed), the editor's document agrees with it, every run that was in flight has ended
with a verdict, no process the killed server had started is left, and nothing answers 5xx.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
from serve_process import codeyard_serve

from collab.client import CollabClient

STUDENTS = 30
EDITORS = 10  # students who keep main.py open in the editor
KILLS = 10 if os.environ.get("CODEYARD_LONG") else 2  # make test-long: the 10 kills
PASSWORD = "a long password"
SLOW_PROGRAM = "import time\ntime.sleep(20)\n"


@dataclass
class Student:
    name: str
    cookies: httpx.Cookies
    project: str = ""
    acked: str = ""  # the last save the server answered 2xx to (at first, the template's text)
    after_ack: list[str] = field(default_factory=list)  # saves sent since, whose answer may have been lost
    runs: list[str] = field(default_factory=list)

    def headers(self) -> dict[str, str]:
        return {"X-CSRF-Token": self.cookies["codeyard_csrf"]}


def server_pid(url: str) -> int:
    """`codeyard serve` (with workers, their parent: the shared socket is listed under one of them)."""
    port = int(url.rsplit(":", 1)[1])
    holder = psutil.Process(next(c.pid for c in psutil.net_connections("tcp")
                                 if c.status == psutil.CONN_LISTEN and c.laddr.port == port and c.pid))
    parent = holder.parent() if "ide_server.workers" in holder.cmdline() else None
    return parent.pid if parent is not None else holder.pid


def enrol(url: str) -> list[Student]:
    students = []
    for i in range(STUDENTS):
        with httpx.Client(base_url=url, timeout=30) as client:
            client.post("/api/auth/register", json={"username": f"student{i}", "password": PASSWORD}).raise_for_status()
            student = Student(f"student{i}", httpx.Cookies(client.cookies))
            answer = client.post("/api/projects", json={"name": "crash", "template": "python"}, headers=student.headers())
            student.project = answer.raise_for_status().json()["id"]
            client.put(f"/api/projects/{student.project}/files/content/slow.py", content=SLOW_PROGRAM,
                       headers=student.headers()).raise_for_status()
            student.acked = client.get(f"/api/projects/{student.project}/files/content/main.py").raise_for_status().text
        students.append(student)
    return students


async def open_editor(url: str, student: Student) -> CollabClient:
    """A y-websocket client on main.py that keeps applying what the room sends."""
    cookie = "; ".join(f"{k}={v}" for k, v in student.cookies.items())
    editor = CollabClient()
    await editor.connect(url.replace("http", "ws", 1) + f"/ws/collab/{student.project}/main.py", {"Cookie": cookie},
                         origin=url)
    return editor


async def storm(url: str, students: list[Student], round_no: int, kill_after: float,
                orphans: list[tuple[int, float]]) -> None:
    """Everyone saves as fast as answers come (a few start a slow run) until the server is killed,
    `kill_after` seconds after the first acknowledged save (so every kill lands among saves, however
    slowly this host makes clients); `orphans` gets the processes the server had started (sandboxes,
    git) at that moment."""
    pid = server_pid(url)
    editors = [await open_editor(url, s) for s in students[:EDITORS]]
    clients = [httpx.AsyncClient(base_url=url, cookies=s.cookies, timeout=10) for s in students]
    saving = asyncio.Event()

    async def save_forever(student: Student, client: httpx.AsyncClient) -> None:
        if students.index(student) % 5 == 0:
            try:
                answer = await client.post(f"/api/projects/{student.project}/runs", json={"entry": "slow.py"},
                                           headers=student.headers())
            except httpx.HTTPError:
                return  # the server is gone
            assert answer.status_code == 202, answer.text
            student.runs.append(answer.json()["id"])
        for n in range(10_000):
            text = f"print('{student.name} round {round_no} save {n}')\n"
            student.after_ack.append(text)
            try:
                answer = await client.put(f"/api/projects/{student.project}/files/content/main.py",
                                          content=text, headers=student.headers())
            except httpx.HTTPError:
                return  # the server is gone
            assert answer.status_code == 200, answer.text
            student.acked, student.after_ack = text, []
            saving.set()

    async def kill() -> None:
        await asyncio.wait_for(saving.wait(), 60)  # no save answered in a minute: fail, don't hang
        await asyncio.sleep(kill_after)
        server = psutil.Process(pid)
        orphans.extend((p.pid, p.create_time()) for p in server.children(recursive=True))
        for process in [server, *server.children()]:  # with workers: all at once, as a power cut would
            os.kill(process.pid, signal.SIGKILL)

    try:
        await asyncio.gather(kill(), *(save_forever(s, c) for s, c in zip(students, clients)))
    finally:
        for client in clients:
            await client.aclose()
    for editor in editors:
        await editor.close()


def still_alive(processes: list[tuple[int, float]]) -> list[int]:
    alive = []
    for pid, started in processes:
        try:
            if psutil.Process(pid).create_time() == started:
                alive.append(pid)
        except psutil.NoSuchProcess:
            continue
    return alive


async def check_after_restart(url: str, students: list[Student], orphans: list[tuple[int, float]]) -> None:
    editors = [await open_editor(url, s) for s in students[:EDITORS]]
    await asyncio.sleep(1.5)  # long enough for a room to write back a stale text, if it would
    for i, student in enumerate(students):
        async with httpx.AsyncClient(base_url=url, cookies=student.cookies, timeout=10) as client:
            text = (await client.get(f"/api/projects/{student.project}/files/content/main.py")).text
            assert text in [student.acked, *student.after_ack], (student.name, text, student.acked)
            if i < EDITORS:
                assert str(editors[i].text) == text
            for run_id in student.runs:
                run = (await client.get(f"/api/runs/{run_id}")).json()
                assert run["status"] == "finished" and run["verdict"], run
            tree = await client.get(f"/api/projects/{student.project}/files")
            assert tree.status_code == 200
            student.acked, student.after_ack = text, []
    for editor in editors:
        await editor.close()
    assert still_alive(orphans) == []
    orphans.clear()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("workers", [1, 2])
def test_no_acknowledged_save_is_lost_over_ten_kills(tmp_path: Path, workers: int) -> None:
    """One process, and serve's default of workers (the parent, the workers and their Redis killed at once)."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    chance = random.Random(25)
    orphans: list[tuple[int, float]] = []
    settings = {"CODEYARD_WORKERS": str(workers)}
    with codeyard_serve(data_dir, settings) as url:
        students = enrol(url)
        asyncio.run(storm(url, students, 0, chance.uniform(0.5, 2.0), orphans))
    for round_no in range(1, KILLS + 1):
        with codeyard_serve(data_dir, settings) as url:
            asyncio.run(check_after_restart(url, students, orphans))
            if round_no < KILLS:
                asyncio.run(storm(url, students, round_no, chance.uniform(0.5, 2.0), orphans))
    assert sum("round" in s.acked for s in students) >= STUDENTS // 2  # saves were checked, not only the template
