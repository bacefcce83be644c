"""The bubblewrap backend: Linux namespaces, a seccomp filter, cgroup and rlimit limits.

The program runs with new user, pid, net, ipc, uts, mount and cgroup namespaces, as uid 1000 inside
(a per-run uid outside), with no capabilities, read-only system folders, an empty network, fresh
/tmp and /dev/shm, and only the workspace writable.
"""

from __future__ import annotations

import math
import os
import shutil

from sandbox.backend import WORKSPACE, Backend, Execution, ExitStatus, RunContext
from sandbox.process import HostProcess, exit_status
from sandbox.seccomp import filter_program

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime",
             "/etc/nsswitch.conf", "/etc/ssl/certs")
SANDBOX_UID = 1000
PASSWD = "root:x:0:0::/:/usr/sbin/nologin\nuser:x:1000:1000::/tmp:/bin/bash\nnobody:x:65534:65534::/:/usr/sbin/nologin\n"
GROUP = "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"


def _system_binds() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for path in ETC_FILES:
        args += ["--ro-bind-try", path, path]
    return args


def bwrap_argv(ctx: RunContext, seccomp_fd: int, passwd_fd: int, group_fd: int, env_fd: int) -> list[str]:
    limits = ctx.spec.limits
    args = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all", "--die-with-parent", *([] if ctx.spec.tty else ["--new-session"]), "--cap-drop", "ALL",
        "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
        *_system_binds(),
        "--ro-bind-data", str(passwd_fd), "/etc/passwd", "--ro-bind-data", str(group_fd), "/etc/group",
        "--proc", "/proc", "--dev", "/dev",
        "--size", str(limits.disk_bytes), "--tmpfs", "/tmp",
        "--size", str(limits.disk_bytes), "--tmpfs", "/dev/shm",
        "--bind", str(ctx.workspace), WORKSPACE, "--chdir", WORKSPACE,
        *[arg for m in ctx.spec.mounts for arg in ("--bind" if m.writable else "--ro-bind", str(m.source), m.target)],
        "--remount-ro", "/",
        "--clearenv",
        "--args", str(env_fd),  # the variables come from a memfd, so values (secrets) stay off host command lines
    ]
    return [*args, "--seccomp", str(seccomp_fd), "--", *ctx.spec.command]


def environment_args(ctx: RunContext) -> bytes:
    """`--setenv NAME VALUE` for each variable, NUL-separated, as `bwrap --args FD` reads them."""
    return b"".join(f"{part}\0".encode() for key, value in ctx.spec.environment().items() for part in ("--setenv", key, value))


def _data_fd(data: bytes) -> int:
    """A memfd holding data at offset 0, for bwrap options that read a file descriptor."""
    fd = os.memfd_create("codeyard-data", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


# Joins the run's cgroups, then execs the rest of its arguments. A constant script: the cgroup
# files come in as arguments ("$1"...), nothing is pasted into it. A small shell joining the
# cgroup and exec'ing on is much cheaper than a Python preexec_fn (which forces fork over vfork).
JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


def launcher_argv(ctx: RunContext) -> list[str]:
    """sh (join cgroups) -> prlimit (rlimits) -> setpriv (drop to the run's uid) -> what follows."""
    limits = ctx.spec.limits
    cpu = math.ceil(limits.cpu_seconds)
    procs_files = ctx.cgroup.procs_files() if ctx.cgroup else []
    rlimits = [f"--cpu={cpu}:{cpu + 1}", f"--fsize={limits.file_bytes}", f"--nofile={limits.open_files}",
               f"--nproc={limits.pids}", "--core=0"]
    if not procs_files:  # no cgroup: bound the address space instead
        rlimits.append(f"--as={limits.memory_bytes}")
    return ["/bin/sh", "-c", JOIN_CGROUPS, "sh", *procs_files, "--",
            "prlimit", *rlimits, "--",
            "setpriv", f"--reuid={ctx.uid}", f"--regid={ctx.uid}", "--clear-groups", "--"]


class _BwrapExecution(Execution):
    def __init__(self, proc: HostProcess) -> None:
        self.proc = proc

    async def write_stdin(self, data: bytes) -> None:
        await self.proc.write_stdin(data)

    async def close_stdin(self) -> None:
        await self.proc.close_stdin()

    def kill(self) -> None:
        self.proc.kill()

    async def resize(self, rows: int, cols: int) -> None:
        self.proc.resize(rows, cols)

    async def wait(self) -> ExitStatus:
        return exit_status(*await self.proc.wait())


class BwrapBackend(Backend):
    name = "bwrap"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if shutil.which("bwrap") is None:
            return "bubblewrap is not installed (apt-get install bubblewrap)"
        if os.geteuid() != 0:
            return "the bubblewrap backend must run as root (it mounts per-run workspaces and uses per-run uids)"
        return None

    async def launch(self, ctx: RunContext) -> Execution:
        fds = (_data_fd(filter_program()), _data_fd(PASSWD.encode()), _data_fd(GROUP.encode()), _data_fd(environment_args(ctx)))
        try:
            argv, env, cwd = launcher_argv(ctx) + bwrap_argv(ctx, *fds), {"PATH": "/usr/bin:/bin"}, str(ctx.workspace)
            if ctx.spec.terminal:
                proc = await HostProcess.spawn_terminal(argv, ctx.run, env, cwd, fds, size=ctx.spec.terminal)
            else:
                proc = await HostProcess.spawn(argv, ctx.run, env, cwd, fds)
        finally:
            for fd in fds:
                os.close(fd)
        return _BwrapExecution(proc)
