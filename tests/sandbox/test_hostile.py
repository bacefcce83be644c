"""Hostile programs against both backends, each with the verdict it must get. After every test the
autouse fixture checks the run left no process, container, mount, folder or cgroup behind."""

from __future__ import annotations

import asyncio
import os
import socket
from urllib.parse import urlparse

import pytest
from conftest import make_spec

from sandbox.backend import RunSpec
from sandbox.verdict import Verdict


async def run_py(backend, project, code: str, stdin: bytes = b"", **limits):
    (project / "main.py").write_text(code)
    return await backend.run(make_spec(project, ["python3", "main.py"], **limits), stdin=stdin)


async def test_fork_bomb(backend, project):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    result = await run_py(backend, project, code, wall_seconds=2)
    assert result.verdict == Verdict.TIME_LIMIT, result
    again = await run_py(backend, project, "print('still fine')")
    assert again.verdict == Verdict.OK and again.stdout == b"still fine\n"


async def test_memory_bomb(backend, project):
    result = await run_py(backend, project, "a = []\nwhile True:\n    a.append(bytearray(8 << 20))\n", memory_bytes=96 << 20)
    assert result.verdict == Verdict.MEMORY_LIMIT, result
    assert (96 << 20) * 0.5 <= result.peak_memory_bytes <= (96 << 20) * 1.1


async def test_cpu_loop(backend, project):
    result = await run_py(backend, project, "while True:\n    pass\n", cpu_seconds=1, wall_seconds=30)
    assert result.verdict == Verdict.TIME_LIMIT, result
    assert result.cpu_seconds >= 0.5


async def test_sleep_forever(backend, project):
    result = await run_py(backend, project, "import time\ntime.sleep(10**6)\n", wall_seconds=1)
    assert result.verdict == Verdict.TIME_LIMIT and result.wall_seconds < 10, result


async def test_sigstop_itself(backend, project):
    result = await run_py(backend, project, "import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)\n", wall_seconds=1)
    assert result.verdict == Verdict.TIME_LIMIT, result


async def test_block_on_stdin(backend, project):
    (project / "main.py").write_text("input()\n")
    run = await backend.start(make_spec(project, ["python3", "main.py"], wall_seconds=1))
    result = await run.result()  # stdin stays open: the program waits until the wall timer
    assert result.verdict == Verdict.TIME_LIMIT, result


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
async def test_endless_output(backend, project, stream):
    result = await run_py(backend, project, f"import sys\nwhile True:\n    sys.{stream}.write('x' * 1000)\n", output_bytes=64 << 10)
    assert result.verdict == Verdict.OUTPUT_LIMIT, result
    assert len(result.stdout) + len(result.stderr) == 64 << 10
    assert getattr(result, stream).startswith(b"xxx")


async def test_disk_fill(backend, project):
    code = "i = 0\nwhile True:\n    open(f'fill{i}', 'wb').write(bytes(1 << 20))\n    i += 1\n"
    result = await run_py(backend, project, code, disk_bytes=8 << 20)
    assert result.verdict == Verdict.RUNTIME_ERROR and b"No space left on device" in result.stderr, result
    copied = sum(p.stat().st_size for p in project.iterdir())
    assert copied <= 8 << 20


async def test_huge_file_via_seek(backend, project):
    code = "f = open('big', 'wb')\nf.seek(10 << 30)\nf.write(b'x')\nf.close()\n"
    result = await run_py(backend, project, code, file_bytes=1 << 20)
    assert result.verdict == Verdict.RUNTIME_ERROR and b"File too large" in result.stderr, result
    assert not (project / "big").exists() or (project / "big").stat().st_size <= 1 << 20


async def test_tmp_and_shm_do_not_survive_between_runs(backend, project):
    first = await run_py(backend, project, "open('/tmp/marker', 'w').write('1')\nopen('/dev/shm/marker', 'w').write('1')\n")
    assert first.verdict == Verdict.OK, first
    second = await run_py(backend, project, "import os\nprint(os.path.exists('/tmp/marker'), os.path.exists('/dev/shm/marker'))\n")
    assert second.stdout == b"False False\n", second


async def test_network_and_dns_refused(backend, project):
    code = (
        "import socket\n"
        "for target in [('1.1.1.1', 53), ('151.101.2.132', 80)]:\n"
        "    try:\n"
        "        socket.create_connection(target, timeout=2); print('CONNECTED', target)\n"
        "    except OSError: print('refused')\n"
        "try:\n"
        "    socket.getaddrinfo('deb.debian.org', 80); print('RESOLVED')\n"
        "except OSError: print('refused')\n"
    )
    result = await run_py(backend, project, code)
    assert result.stdout == b"refused\nrefused\nrefused\n", result


async def test_host_loopback_services_unreachable(backend, project):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    ports = [listener.getsockname()[1]]
    for var in ("CODEYARD_TEST_REDIS_URL", "CODEYARD_TEST_POSTGRES_URL"):
        if os.environ.get(var):
            url = urlparse(os.environ[var])
            if url.port:
                ports.append(url.port)
    code = (
        "import socket\n"
        f"for port in {ports!r}:\n"
        "    for host in ('127.0.0.1', 'localhost', '172.17.0.1'):\n"
        "        try:\n"
        "            socket.create_connection((host, port), timeout=1); print('CONNECTED', host, port)\n"
        "        except OSError: pass\n"
        "print('done')\n"
    )
    try:
        result = await run_py(backend, project, code)
    finally:
        listener.close()
    assert result.stdout == b"done\n", result


async def test_no_server_secrets_visible(backend, project, monkeypatch):
    monkeypatch.setenv("CODEYARD_SECRET_KEY", "test-secret-do-not-leak-4f1c")  # a server secret in the host env
    code = (
        "import os\nprint(sorted(os.environ))\n"
        "for pid in os.listdir('/proc'):\n"
        "    if pid.isdigit():\n"
        "        try: print(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "        except OSError: pass\n"
    )
    result = await run_py(backend, project, code)
    assert result.verdict == Verdict.OK, result
    assert b"test-secret" not in result.stdout and b"CODEYARD" not in result.stdout and b"DOCKER_HOST" not in result.stdout
    assert result.stdout.splitlines()[0] == b"['HOME', 'LANG', 'PATH', 'PWD', 'PYTHONUNBUFFERED']" or b"HOSTNAME" in result.stdout


async def test_shadow_and_other_projects_unreadable(backend, project, tmp_path):
    other = tmp_path / "other-user-project"
    other.mkdir()
    (other / "secret.txt").write_text("other user's work")
    targets = ["/etc/shadow", str(other / "secret.txt"), "/root/.bashrc", "/work/main/pyproject.toml",
               os.environ["CODEYARD_SANDBOX_DIR"]]
    code = (
        "import os\n"
        f"for path in {targets!r}:\n"
        "    try:\n"
        "        print('READ', path, open(path).read()[:20] if os.path.isfile(path) else os.listdir(path))\n"
        "    except OSError: print('denied')\n"
    )
    result = await run_py(backend, project, code)
    assert result.stdout == b"denied\n" * len(targets), result


async def test_writes_outside_workspace_refused(backend, project):
    code = (
        "for path in ['/usr/evil', '/etc/evil', '/evil', '/bin/evil', '/proc/sys/kernel/hostname']:\n"
        "    try:\n"
        "        open(path, 'w').write('x'); print('WROTE', path)\n"
        "    except OSError: print('refused')\n"
        "open('/workspace/ok.txt', 'w').write('fine')\n"
    )
    result = await run_py(backend, project, code)
    assert result.stdout == b"refused\n" * 5, result
    assert (project / "ok.txt").read_text() == "fine"
    assert not os.path.exists("/evil") and not os.path.exists("/usr/evil")


async def test_symlinks_planted_for_the_host(backend, project, tmp_path):
    host_secret = tmp_path / "host-secret.txt"
    host_secret.write_text("host only")
    (project / "sub").mkdir()
    (project / "linked-in").symlink_to(host_secret)  # the project itself holds a link to a host file
    code = (
        "import os\n"
        "os.symlink('/bin/rm', 'run')\n"
        f"os.symlink({str(host_secret)!r}, 'leak.txt')\n"
        "os.symlink('/etc/passwd', 'passwd')\n"
        "os.rmdir('sub'); os.symlink('/etc', 'sub')\n"
        "os.mkfifo('pipe')\n"
        "print(os.path.exists('linked-in'))\n"
    )
    result = await run_py(backend, project, code)
    assert result.verdict == Verdict.OK and result.stdout == b"False\n", result
    for name in ("run", "leak.txt", "passwd", "pipe"):
        assert not (project / name).exists() and not (project / name).is_symlink(), name
    assert (project / "sub").is_dir() and not (project / "sub").is_symlink() and list((project / "sub").iterdir()) == []
    assert host_secret.read_text() == "host only" and os.path.exists("/bin/rm")
    assert {"run", "leak.txt", "passwd", "pipe", "linked-in"} <= set(result.files_skipped)


async def test_newline_and_semicolon_stay_arguments(backend, project):
    args = ["a;b", "c\nd", "$(touch pwned)", "`id`", "x && echo y", "'; rm -rf / #"]
    result = await backend.run(make_spec(project, ["python3", "-c", "import sys; print(repr(sys.argv[1:]))", *args]))
    assert result.stdout.decode().strip() == repr(args)
    assert not (project / "pwned").exists()


async def test_kill_all_kills_only_the_sandbox(backend, project, tmp_path):
    victim_dir = tmp_path / "victim"
    victim_dir.mkdir()
    (victim_dir / "main.py").write_text("import time\ntime.sleep(2)\nprint('survived')\n")
    victim = await backend.start(make_spec(victim_dir, ["python3", "main.py"]))
    await asyncio.sleep(0.5)
    killer = await backend.run(make_spec(project, ["bash", "-c", "kill -9 -1; echo after"]))
    assert killer.verdict in (Verdict.OK, Verdict.RUNTIME_ERROR)
    survivor = await victim.result()
    assert survivor.verdict == Verdict.OK and survivor.stdout == b"survived\n", survivor


async def test_setuid_and_ptrace_refused(backend, project):
    code = (
        "import ctypes, os\n"
        "try:\n    os.setuid(0); print('BECAME ROOT')\nexcept OSError: print('setuid refused')\n"
        "status = open('/proc/self/status').read()\n"
        "print([l for l in status.splitlines() if l.startswith(('CapEff', 'NoNewPrivs'))])\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "child = os.fork()\n"
        "if child == 0:\n    import time; time.sleep(5); os._exit(0)\n"
        "print('ptrace', libc.ptrace(16, child, 0, 0), ctypes.get_errno())\n"
        "os.kill(child, 9)\n"
        "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
        "print('mount', libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())\n"
    )
    result = await run_py(backend, project, code)
    lines = result.stdout.decode().splitlines()
    assert lines[0] == "setuid refused", result
    assert "CapEff:\\t0000000000000000" in lines[1] and "NoNewPrivs:\\t1" in lines[1]
    assert lines[2:] == ["ptrace -1 1", "unshare -1 1", "mount -1 1"], result


async def test_ten_thousand_threads(backend, project):
    code = "import threading, time\nfor i in range(10000):\n    threading.Thread(target=time.sleep, args=(5,), daemon=True).start()\n"
    result = await run_py(backend, project, code, pids=64)
    assert result.verdict == Verdict.RUNTIME_ERROR and b"can't start new thread" in result.stderr, result


async def test_hundred_thousand_open_files(backend, project):
    code = "files = [open('main.py') for _ in range(100000)]\n"
    result = await run_py(backend, project, code, open_files=256)
    assert result.verdict == Verdict.RUNTIME_ERROR and b"Too many open files" in result.stderr, result


async def test_huge_argv(backend, project):
    many = [f"arg-{i:04d}-" + "y" * 200 for i in range(4000)]  # 800 KB in 4000 arguments
    result = await backend.run(make_spec(project, ["python3", "-c", "import sys; print(len(sys.argv), len(sys.argv[-1]))", *many]))
    assert result.stdout == b"4001 209\n", result
    inner = "import os\nos.execv('/bin/true', ['true'] + ['z' * 100000] * 100)\n"  # 10 MB: past the kernel's limit
    result = await run_py(backend, project, inner)
    assert result.verdict == Verdict.RUNTIME_ERROR and b"Argument list too long" in result.stderr, result
    for argv, message in [(["x"] * 5000, "more than 4096 items"), (["x" * (200 << 10)], "longer than 131072"),
                          (["x" * (100 << 10)] * 20, "longer than 1048576")]:
        with pytest.raises(ValueError, match=message):
            RunSpec(argv, project)
