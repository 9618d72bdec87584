"""The worker's system-call filter: a classic BPF program assembled here by hand (no libseccomp,
which the zygote's `python -I -S` could not import), and the pod-level profile derived from it.

The filter a worker installs once its namespaces and root are set up (so unshare, mount and
pivot_root are no longer needed) refuses:
- other architectures' system calls (the process is killed) and, on x86_64, the x32 ABI;
- system calls newer than the ones reviewed here (ENOSYS, which libc treats as "not available");
- kernel surfaces python never needs: ptrace and cross-process memory, (un)mounting and the new
  mount API, namespaces (unshare, setns, clone with namespace flags; clone3 is ENOSYS so libc
  falls back to clone, whose flags the filter can read), bpf, perf_event_open, userfaultfd,
  io_uring, keyrings, kernel modules, kexec, reboot, swap, clocks, hostname, quotas, handles;
- sockets of every family but AF_UNIX (EAFNOSUPPORT): socketpair and local pipes keep working,
  while AF_INET, AF_NETLINK, AF_PACKET, AF_VSOCK and the rest are gone whatever the network
  namespace holds;
- ioctl(TIOCSTI) (typing into a terminal) and personality flags other than the harmless ones.

    python -m gearshift.services.sandbox.isolation.seccomp > charts/gearshift/files/sandbox-seccomp.json

writes the pod profile (the chart's sandbox uses it): everything allowed except what this filter
refuses and the set-up needs not (unshare, mount, umount2, pivot_root, sethostname), because the
runtime's default profile refuses exactly those set-up calls to a pod without CAP_SYS_ADMIN.
"""

from __future__ import annotations

import ctypes
import errno
import json
import platform
import struct
import sys
from collections.abc import Iterable

from . import libc

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000
NEWEST_REVIEWED_SYSCALL = 462  # mseal (Linux 6.10); numbers above this are unreviewed here

# Numbers of the system calls this filter names, per architecture (asm/unistd_64.h, asm-generic).
_SHARED_NUMBERS = {  # 424 and above are the same on every architecture
    "pidfd_getfd": 438, "clone3": 435, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "mount_setattr": 442, "quotactl_fd": 443,
}
SYSCALLS = {
    "x86_64": {
        **_SHARED_NUMBERS,
        "ioctl": 16, "socket": 41, "socketpair": 53, "clone": 56, "ptrace": 101, "syslog": 103,
        "uselib": 134, "personality": 135, "vhangup": 153, "pivot_root": 155, "_sysctl": 156, "adjtimex": 159,
        "chroot": 161, "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167,
        "swapoff": 168, "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173,
        "init_module": 175, "delete_module": 176, "quotactl": 179, "lookup_dcookie": 212, "clock_settime": 227,
        "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
        "perf_event_open": 298, "fanotify_init": 300, "name_to_handle_at": 303, "open_by_handle_at": 304,
        "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
        "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
    },
    "aarch64": {
        **_SHARED_NUMBERS,
        "lookup_dcookie": 18, "ioctl": 29, "umount2": 39, "mount": 40, "pivot_root": 41, "chroot": 51,
        "vhangup": 58, "quotactl": 60, "acct": 89, "personality": 92, "unshare": 97, "kexec_load": 104,
        "init_module": 105, "delete_module": 106, "clock_settime": 112, "syslog": 116, "ptrace": 117,
        "reboot": 142, "sethostname": 161, "setdomainname": 162, "settimeofday": 170, "adjtimex": 171,
        "socket": 198, "socketpair": 199, "add_key": 217, "request_key": 218, "keyctl": 219, "clone": 220,
        "swapon": 224, "swapoff": 225, "perf_event_open": 241, "fanotify_init": 262, "name_to_handle_at": 264,
        "open_by_handle_at": 265, "clock_adjtime": 266, "setns": 268, "process_vm_readv": 270,
        "process_vm_writev": 271, "kcmp": 272, "finit_module": 273, "bpf": 280, "userfaultfd": 282,
        "kexec_file_load": 294,
    },
}

# Refused (EPERM) in every worker once it is set up; names missing on an architecture are skipped.
DENIED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    "keyctl", "add_key", "request_key", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "reboot", "swapon", "swapoff", "acct", "settimeofday", "clock_settime",
    "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "syslog", "quotactl", "quotactl_fd",
    "lookup_dcookie", "fanotify_init", "name_to_handle_at", "open_by_handle_at", "vhangup",
    "iopl", "ioperm", "uselib", "_sysctl",
)
# What building a worker needs, so the pod profile must allow it (the worker filter does not).
SETUP_ONLY = ("unshare", "mount", "umount2", "pivot_root", "sethostname")

AF_UNIX = 1
TIOCSTI = 0x5412
HARMLESS_PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)  # PER_LINUX(32BIT), UNAME26, query

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6] (little-endian)
_NR, _ARCH = 0, 4
_ARG_LOW = [16 + 8 * i for i in range(6)]

_LD_W_ABS, _JEQ, _JGT, _JGE, _JSET, _RET = 0x20, 0x15, 0x25, 0x35, 0x45, 0x06
RET_KILL_PROCESS, RET_ERRNO, RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000


class _Assembler:
    """Classic BPF with symbolic jump targets, resolved to the 8-bit relative offsets BPF uses."""

    def __init__(self):
        self.code: list[tuple[int, object, object, int]] = []
        self.labels: dict[str, int] = {}

    def load(self, offset: int) -> None:
        self.code.append((_LD_W_ABS, 0, 0, offset))

    def jump(self, op: int, value: int, if_true: object = 0, if_false: object = 0) -> None:
        self.code.append((op, if_true, if_false, value))

    def ret(self, value: int) -> None:
        self.code.append((_RET, 0, 0, value))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def assemble(self) -> bytes:
        out = bytearray()
        for index, (op, if_true, if_false, k) in enumerate(self.code):
            out += struct.pack("<HBBI", op, self._offset(index, if_true), self._offset(index, if_false), k)
        return bytes(out)

    def _offset(self, index: int, target: object) -> int:
        if isinstance(target, int):
            return target
        offset = self.labels[target] - index - 1
        if not 0 <= offset <= 255:
            raise ValueError(f"jump to {target} out of range")
        return offset


def worker_filter(arch: str | None = None) -> bytes:
    """The filter every worker runs under, for this machine's architecture."""
    return program(DENIED, clone_namespaces=False, socket_families=(AF_UNIX,), arch=arch)


def program(denied: Iterable[str], clone_namespaces: bool, socket_families: tuple[int, ...] | None,
            arch: str | None = None) -> bytes:
    """A filter refusing `denied` (EPERM), clone with namespace flags unless clone_namespaces,
    sockets outside socket_families (None: any), plus the fixed rules in the module docstring."""
    arch = arch or platform.machine()
    if arch not in AUDIT_ARCH:
        raise OSError(errno.ENOSYS, f"no seccomp filter for architecture {arch}")
    numbers = SYSCALLS[arch]
    a = _Assembler()
    a.load(_ARCH)
    a.jump(_JEQ, AUDIT_ARCH[arch], 0, "kill")
    a.load(_NR)
    if arch == "x86_64":
        a.jump(_JGE, X32_SYSCALL_BIT, "enosys", 0)
    a.jump(_JGT, NEWEST_REVIEWED_SYSCALL, "enosys", 0)
    for name in sorted({n for n in denied if n in numbers}, key=numbers.get):
        a.jump(_JEQ, numbers[name], "eperm", 0)
    a.jump(_JEQ, numbers["clone3"], "enosys", 0)
    if not clone_namespaces:
        a.jump(_JEQ, numbers["clone"], "clone", 0)
    if socket_families is not None:
        a.jump(_JEQ, numbers["socket"], "socket", 0)
        a.jump(_JEQ, numbers["socketpair"], "socket", 0)
    a.jump(_JEQ, numbers["ioctl"], "ioctl", 0)
    a.jump(_JEQ, numbers["personality"], "personality", 0)
    a.ret(RET_ALLOW)

    a.label("clone")  # flags are the first argument on x86_64 and aarch64 alike
    a.load(_ARG_LOW[0])
    a.jump(_JSET, libc.NAMESPACE_FLAGS, "eperm", "allow")
    a.label("socket")
    a.load(_ARG_LOW[0])
    for family in socket_families or ():
        a.jump(_JEQ, family, "allow", 0)
    a.ret(RET_ERRNO | errno.EAFNOSUPPORT)
    a.label("ioctl")
    a.load(_ARG_LOW[1])
    a.jump(_JEQ, TIOCSTI, "eperm", "allow")
    a.label("personality")
    a.load(_ARG_LOW[0])
    for value in HARMLESS_PERSONALITIES:
        a.jump(_JEQ, value, "allow", 0)
    # any other personality falls through to EPERM
    a.label("eperm")
    a.ret(RET_ERRNO | errno.EPERM)
    a.label("allow")
    a.ret(RET_ALLOW)
    a.label("enosys")
    a.ret(RET_ERRNO | errno.ENOSYS)
    a.label("kill")
    a.ret(RET_KILL_PROCESS)
    return a.assemble()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(filter_program: bytes) -> None:
    """Installs the filter on this (single-threaded) process and everything it starts later.
    Needs no_new_privs (or CAP_SYS_ADMIN); irreversible."""
    buffer = ctypes.create_string_buffer(filter_program, len(filter_program))
    fprog = _SockFprog(len(filter_program) // 8, ctypes.addressof(buffer))
    libc.prctl(libc.PR_SET_SECCOMP, libc.SECCOMP_MODE_FILTER, ctypes.byref(fprog))


def pod_profile() -> dict:
    """The pod's seccomp profile (OCI / Kubernetes Localhost format): allow by default, refuse
    what the worker filter refuses except the calls that build a worker."""
    names = sorted(set(DENIED) - set(SETUP_ONLY))
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_AARCH64"],
        "syscalls": [{"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}],
    }


if __name__ == "__main__":
    json.dump(pod_profile(), sys.stdout, indent=2)
    sys.stdout.write("\n")
