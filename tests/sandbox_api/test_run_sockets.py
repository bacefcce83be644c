"""The run WebSocket (output frames, stdin for input() programs, the exit frame) and the shell PTY."""

from __future__ import annotations

import pytest
from conftest import add_member, new_project, wait_finished
from starlette.websockets import WebSocketDisconnect


def next_output(ws) -> dict:
    """The next frame other than a status one (a run's state changes come as {"type": "status"})."""
    while (frame := ws.receive_json())["type"] == "status":
        pass
    return frame


def frames_until_exit(ws) -> list[dict]:
    frames = []
    while (frame := ws.receive_json())["type"] != "exit":
        frames.append(frame)
    return frames + [frame]


def test_input_program_over_the_websocket(owner):
    pid = new_project(owner, {"main.py": "name = input('name? ')\nprint(f'hi {name}')\nprint(input().upper())\n"})
    run_id = owner.post(f"/api/projects/{pid}/runs", json={}).json()["id"]
    with owner.websocket_connect(f"/ws/runs/{run_id}") as ws:
        seen = ""
        while "name? " not in seen:
            seen += next_output(ws)["data"]
        ws.send_json({"type": "stdin", "data": "Ada\n"})
        ws.send_json({"type": "stdin", "data": "bye\n"})
        ws.send_json({"type": "stdin_eof"})
        frames = frames_until_exit(ws)
    assert seen + "".join(f["data"] for f in frames if f["type"] == "stdout") == "name? hi Ada\nBYE\n"
    assert frames[-1]["verdict"] == "ok" and frames[-1]["id"] == run_id and "stdout" not in frames[-1]


def test_watchers_replay_output_and_viewers_cannot_type(owner, person):
    pid = new_project(owner, {"main.py": "import sys\nprint('out')\nprint('err', file=sys.stderr)\n"})
    viewer = person()
    add_member(owner, pid, viewer, "viewer")
    run_id = owner.post(f"/api/projects/{pid}/runs", json={"stdin": ""}).json()["id"]
    wait_finished(owner, run_id)
    with viewer.websocket_connect(f"/ws/runs/{run_id}") as ws:
        frames = frames_until_exit(ws)
    for stream, text in (("stdout", "out\n"), ("stderr", "err\n")):
        assert "".join(f["data"] for f in frames[:-1] if f["type"] == stream) == text


def test_viewer_stdin_is_refused(owner, person):
    pid = new_project(owner, {"main.py": "print(input())\n"})
    viewer = person()
    add_member(owner, pid, viewer, "viewer")
    run_id = owner.post(f"/api/projects/{pid}/runs", json={}).json()["id"]
    with viewer.websocket_connect(f"/ws/runs/{run_id}") as ws:
        ws.send_json({"type": "stdin", "data": "sneaky\n"})
        assert next_output(ws) == {"type": "error", "message": "only editors of the project can type into a run"}
    owner.post(f"/api/runs/{run_id}/cancel")
    assert wait_finished(owner, run_id)["stdout"] == ""


def test_shell_echo_resize_and_files_back(owner, app):
    pid = new_project(owner, {})
    with owner.websocket_connect(f"/ws/projects/{pid}/shell?rows=30&cols=100") as ws:
        def read_until(marker: str) -> str:
            seen = ""
            while marker not in seen:
                frame = ws.receive_json()
                assert frame["type"] == "output", frame
                seen += frame["data"]
            return seen

        read_until("$ ")
        ws.send_json({"type": "input", "data": "stty size; echo $((6*7)) > answer.txt; echo D''ONE\n"})
        assert "30 100" in read_until("DONE")
        ws.send_json({"type": "resize", "rows": 50, "cols": 132})
        ws.send_json({"type": "resize", "rows": "x", "cols": 1})
        ws.send_json({"type": "input", "data": "stty size; exit\n"})
        seen, errors = "", []
        while (frame := ws.receive_json())["type"] != "exit":
            seen += frame.get("data", "")
            errors += [frame["message"]] if frame["type"] == "error" else []
        assert errors == ["resize: rows and cols must be integers"]
        assert "50 132" in seen and frame == {"type": "exit", "verdict": "ok", "exit_code": 0}
    assert owner.get(f"/api/projects/{pid}/files/content/answer.txt").text == "42\n"


def test_closing_the_shell_socket_ends_the_shell(owner):
    pid = new_project(owner, {})
    with owner.websocket_connect(f"/ws/projects/{pid}/shell") as ws:
        seen = ""
        while "$ " not in seen:
            seen += next_output(ws)["data"]
        ws.send_json({"type": "input", "data": "sleep 1000 &\n"})
    # leaving the block closes the socket; nothing_left_behind checks no process or mount survives


def test_open_shells_are_capped_per_user(owner):
    pid = new_project(owner, {})
    url = f"/ws/projects/{pid}/shell"
    with owner.websocket_connect(url) as first, owner.websocket_connect(url) as second:
        for ws in (first, second):
            assert ws.receive_json()["type"] == "output"  # both shells are up
        with owner.websocket_connect(url) as third:
            closed = third.receive()
        assert closed["code"] == 4429 and "2 shells open" in closed["reason"]
    with owner.websocket_connect(url) as again:  # places are given back when shells close
        assert again.receive_json()["type"] == "output"


def closed_with(ws) -> int:
    """Read until the server closes the socket; its close code."""
    with pytest.raises(WebSocketDisconnect) as closed:
        while True:
            ws.receive_json()
    return closed.value.code


@pytest.mark.timeout(120)  # a socket left open would block its read forever
def test_sockets_close_when_the_member_loses_the_access_they_were_opened_with(owner, person):
    """A removed member's run and shell sockets end at once (4403); a downgraded editor loses the shell
    and the run socket they could type into, and may follow the run again as a viewer."""
    pid = new_project(owner, {"main.py": "print(input())\n"})
    leaving, downgraded = person(), person()
    add_member(owner, pid, leaving, "editor")
    add_member(owner, pid, downgraded, "editor")
    run_id = owner.post(f"/api/projects/{pid}/runs", json={"interactive": True}).json()["id"]  # waits for input
    for member, change in ((leaving, lambda: owner.delete(f"/api/projects/{pid}/members/{leaving.username}")),
                           (downgraded, lambda: owner.request("PATCH", f"/api/projects/{pid}/members/{downgraded.username}",
                                                            json={"role": "viewer"}))):
        with member.websocket_connect(f"/ws/runs/{run_id}") as run_ws, \
                member.websocket_connect(f"/ws/projects/{pid}/shell") as shell_ws:
            seen = ""
            while "$ " not in seen:
                seen += next_output(shell_ws)["data"]
            assert change().status_code in (200, 204)
            assert closed_with(shell_ws) == 4403
            assert closed_with(run_ws) == 4403
    with downgraded.websocket_connect(f"/ws/runs/{run_id}") as ws:  # as a viewer now: output only
        ws.send_json({"type": "stdin", "data": "sneaky\n"})
        assert next_output(ws) == {"type": "error", "message": "only editors of the project can type into a run"}
    with owner.websocket_connect(f"/ws/runs/{run_id}") as ws:  # the owner's access never changed
        ws.send_json({"type": "stdin", "data": "still here\n"})
        assert frames_until_exit(ws)[-1]["verdict"] == "ok"
    assert wait_finished(owner, run_id)["stdout"] == "still here\n"
