"""One seccomp policy for both backends: refuse the syscalls a student program never needs.

It is a deny list on top of namespaces, no capabilities and no_new_privs: debugging other
processes (ptrace), new namespaces or mounts, kernel keyrings, BPF, perf, io_uring and module or
reboot calls get EPERM. clone3 gets ENOSYS so libc falls back to clone, whose namespace flags are
checked here (clone3 flags live in memory a filter cannot read). The bubblewrap backend loads it
as raw BPF; the Docker backend gets the same table as a Docker seccomp profile (Docker's default
profile allows ptrace, so it is replaced by this one rather than kept).
"""

from __future__ import annotations

import json
import struct

AUDIT_ARCH_X86_64 = 0xC000003E
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _KILL, _ERRNO = 0x7FFF0000, 0x80000000, 0x00050000
EPERM, ENOSYS = 1, 38
CLONE = 56
CLONE3 = 435
CLONE_NAMESPACE_FLAGS = 0x7E020000  # NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET
DENIED = {
    "ptrace": 101, "syslog": 103, "personality": 135, "pivot_root": 155, "chroot": 161, "acct": 163,
    "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168, "reboot": 169, "iopl": 172,
    "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179, "kexec_load": 246,
    "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298,
    "name_to_handle_at": 303, "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
    "fspick": 433, "mount_setattr": 442, "uselib": 134, "ustat": 136, "sysfs": 139, "vhangup": 153,
    "_sysctl": 156, "adjtimex": 159, "settimeofday": 164, "create_module": 174, "get_kernel_syms": 177,
    "query_module": 178, "nfsservctl": 180, "lookup_dcookie": 212, "clock_settime": 227, "mbind": 237,
    "set_mempolicy": 238, "migrate_pages": 256, "move_pages": 279, "fanotify_init": 300,
    "clock_adjtime": 305, "kcmp": 312, "pidfd_getfd": 438,
}


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program() -> bytes:
    """The BPF program, as bwrap --seccomp expects it (raw struct sock_filter array)."""
    nrs = sorted(DENIED.values())
    # layout: 0 ld arch, 1 jeq, 2 kill, 3 ld nr, 4 jge x32, 5 clone3?, 6..6+n-1 denied, then
    # clone check (3 ins), allow, deny, enosys
    body = 6 + len(nrs)
    clone_at, allow_at = body, body + 3
    deny_at, enosys_at = allow_at + 1, allow_at + 2
    prog = [
        _ins(_LD_ABS, 4),
        _ins(_JEQ, AUDIT_ARCH_X86_64, 1, 0),
        _ins(_RET, _KILL),
        _ins(_LD_ABS, 0),
        _ins(_JGE, 0x40000000, deny_at - 5, 0),
        _ins(_JEQ, CLONE3, enosys_at - 6, 0),
    ]
    for i, nr in enumerate(nrs):
        prog.append(_ins(_JEQ, nr, deny_at - (6 + i + 1), 0))
    prog += [
        _ins(_JEQ, CLONE, 0, allow_at - (clone_at + 1)),
        _ins(_LD_ABS, 16),  # low 32 bits of clone's flags argument
        _ins(_JSET, CLONE_NAMESPACE_FLAGS, deny_at - (clone_at + 3), 0),
        _ins(_RET, _ALLOW),
        _ins(_RET, _ERRNO | EPERM),
        _ins(_RET, _ERRNO | ENOSYS),
    ]
    return b"".join(prog)


def docker_profile() -> str:
    """The same policy as a Docker seccomp profile (JSON), for security_opt `seccomp=...`."""
    errno = {"action": "SCMP_ACT_ERRNO", "errnoRet": EPERM}
    rules = [{"names": sorted(DENIED), **errno}, {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS}]
    for bit in range(32):  # clone is refused when any namespace flag is set: one rule per flag
        flag = 1 << bit
        if CLONE_NAMESPACE_FLAGS & flag:
            rules.append({"names": ["clone"], **errno,
                          "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}]})
    return json.dumps({"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_X86_64"], "syscalls": rules})
