"""The run interface on both backends: output, input, streaming, files both ways, cancel, verdicts."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import TEST_LIMITS, make_spec

from sandbox.backend import Mount, RunSpec
from sandbox.verdict import Verdict


async def test_print_and_exit_code(backend, project):
    (project / "main.py").write_text("import sys\nprint('hello')\nprint('oops', file=sys.stderr)\nsys.exit(3)\n")
    result = await backend.run(make_spec(project, ["python3", "main.py"]))
    assert result.stdout == b"hello\n"
    assert result.stderr == b"oops\n"
    assert result.verdict == Verdict.RUNTIME_ERROR and result.exit_code == 3
    assert result.wall_seconds > 0 and result.peak_memory_bytes > 1 << 20


async def test_input_program_talks_over_stdin(backend, project):
    (project / "main.py").write_text("name = input('name? ')\nprint(f'hi {name}')\nprint(int(input()) * 2)\n")
    run = await backend.start(make_spec(project, ["python3", "main.py"]))
    seen = b""
    chunks = run.chunks()
    async for chunk in chunks:
        seen += chunk.data
        if b"name? " in seen:
            break
    await run.send_stdin(b"ada\n21\n")
    await run.close_stdin()
    async for chunk in chunks:
        seen += chunk.data
    result = await run.result()
    assert result.verdict == Verdict.OK
    assert seen == b"name? hi ada\n42\n" == result.stdout


async def test_output_streams_before_the_run_ends(backend, project):
    (project / "main.py").write_text("import time\nprint('first', flush=True)\ntime.sleep(30)\n")
    run = await backend.start(make_spec(project, ["python3", "main.py"], wall_seconds=40))
    seen = b""
    chunks = run.chunks()
    while not seen.endswith(b"\n"):
        chunk = await asyncio.wait_for(chunks.__anext__(), 10)
        assert chunk.stream == "stdout"
        seen += chunk.data
    assert seen == b"first\n"
    run.cancel()
    result = await run.result()
    assert result.verdict == Verdict.CANCELLED
    assert result.wall_seconds < 20


async def test_files_flow_both_ways(backend, project):
    (project / "data").mkdir()
    (project / "data" / "in.txt").write_text("41")
    (project / "main.py").write_text(
        "import os\nn = int(open('data/in.txt').read())\nos.makedirs('out', exist_ok=True)\n"
        "open('out/answer.txt', 'w').write(str(n + 1))\nopen('data/in.txt', 'w').write('changed')\n"
    )
    result = await backend.run(make_spec(project, ["python3", "main.py"]))
    assert result.verdict == Verdict.OK, result
    assert (project / "out" / "answer.txt").read_text() == "42"
    assert (project / "data" / "in.txt").read_text() == "changed"
    assert sorted(result.files_written) == ["data/in.txt", "out/answer.txt"]


async def test_git_folder_stays_out_both_ways(backend, project):
    (project / ".git").mkdir()
    (project / ".git" / "config").write_text("[core]")
    code = "import os\nprint(os.listdir('.'))\nos.makedirs('.git', exist_ok=True)\nopen('.git/hook', 'w').write('x')\n"
    result = await backend.run(make_spec(project, ["python3", "-c", code]))
    assert result.stdout == b"[]\n" and result.verdict == Verdict.OK, result
    assert sorted(p.name for p in (project / ".git").iterdir()) == ["config"]


async def test_unchanged_files_are_not_written_back(backend, project):
    (project / "main.py").write_text("print(open('main.py').read()[:5])\n")
    result = await backend.run(make_spec(project, ["python3", "main.py"]))
    assert result.verdict == Verdict.OK and result.files_written == []


async def test_missing_program_is_a_runtime_error(backend, project):
    result = await backend.run(make_spec(project, ["no-such-program"]))
    assert result.verdict == Verdict.RUNTIME_ERROR and result.exit_code != 0


@pytest.mark.parametrize("argv", ["python3 main.py", [], ["python3", "a\0b"]])
def test_bad_argv_is_refused(project, argv):
    with pytest.raises(ValueError, match="argv"):
        RunSpec(argv, project)


async def test_warm_pool_serves_runs_and_leaves_nothing(docker_engine, runner_image, project):
    from sandbox.backends.docker import DockerBackend
    from sandbox.limits import Limits

    backend = DockerBackend(docker_engine, pool_limits=Limits(**TEST_LIMITS), pool_size=2)
    await backend.warm_up()
    try:
        for i in range(3):
            result = await backend.run(make_spec(project, ["python3", "-c", f"print({i})"]))
            assert result.stdout == f"{i}\n".encode()
            await backend.warm_up()
        assert backend.pool_hits == 3
        cold = await backend.run(make_spec(project, ["python3", "-c", "print('cold')"], memory_bytes=200 << 20))
        assert cold.stdout == b"cold\n" and backend.pool_hits == 3
    finally:
        await backend.close()


@pytest.fixture
def shared():
    """A folder the run uids can reach (pytest's tmp_path is private to root)."""
    folder = Path(tempfile.mkdtemp(prefix="codeyard-mount-test-"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder)


async def test_a_mounted_folder_is_seen_read_only(backend, project, shared):
    """How a package environment reaches a run, on every backend (a warm container cannot take mounts: cold)."""
    (shared / "lib.py").write_text("NAME = 'shared'\n")
    os.chmod(shared / "lib.py", 0o666)  # only the read-only mount stands in the way
    code = "import lib\nprint(lib.NAME)\nopen('/packages/lib.py', 'a')\n"
    (project / "main.py").write_text(code)
    spec = dataclasses.replace(make_spec(project, ["python3", "main.py"]), env={"PYTHONPATH": "/packages"},
                               mounts=(Mount(shared, "/packages"),))
    result = await backend.run(spec)
    assert result.stdout == b"shared\n" and result.verdict == Verdict.RUNTIME_ERROR
    assert b"Read-only file system" in result.stderr, result.stderr
    assert (shared / "lib.py").read_text() == "NAME = 'shared'\n"
