"""The system calls isolation needs, through ctypes (Python's os module lacks most of them)."""

from __future__ import annotations

import ctypes
import errno
import os
import platform

CLONE_NEWTIME = 0x00000080
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (CLONE_NEWTIME | CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC
                   | CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNET)

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
# Mount options as /proc/self/mountinfo spells them; a remount must repeat the locked ones.
MOUNT_FLAGS = {
    "ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
}

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 22, 36, 38
SECCOMP_MODE_FILTER = 2
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}

_libc = ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _bytes(value: str | None) -> bytes | None:
    return value.encode() if value is not None else None


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    check(_libc.mount(_bytes(source), _bytes(target), _bytes(fstype), ctypes.c_ulong(flags), _bytes(data)), f"mount {target}")


def umount(target: str, flags: int = 0) -> None:
    check(_libc.umount2(_bytes(target), flags), f"umount {target}")


def unshare(flags: int) -> None:
    check(_libc.unshare(flags), "unshare")


def pivot_root(new_root: str, put_old: str) -> None:
    number = SYS_PIVOT_ROOT[platform.machine()]
    check(_libc.syscall(ctypes.c_long(number), _bytes(new_root), _bytes(put_old)), "pivot_root")


def prctl(option: int, *values: object) -> None:
    """prctl(option, ...): each value an integer or a ctypes reference (byref)."""
    arguments = [ctypes.c_ulong(v) if isinstance(v, int) else v for v in values]
    arguments += [ctypes.c_ulong(0)] * (4 - len(arguments))
    check(_libc.prctl(option, *arguments), f"prctl {option}")


def sethostname(name: str) -> None:
    encoded = name.encode()
    check(_libc.sethostname(encoded, len(encoded)), "sethostname")


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_capabilities() -> None:
    """Empties the bounding set and every capability set of this process, for good."""
    for cap in range(64):  # up to the kernel's last capability, which answers the next with EINVAL
        try:
            prctl(PR_CAPBSET_DROP, cap)
        except OSError as exc:
            if exc.errno != errno.EINVAL or cap == 0:
                raise
            break
    clear_capabilities()


def clear_capabilities() -> None:
    """Empties the effective, permitted and inheritable sets (and with them the ambient set)."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    nothing = (_CapData * 2)()
    check(_libc.capset(ctypes.byref(header), nothing), "capset")


def map_user(inside_uid: int, inside_gid: int, outside_uid: int, outside_gid: int) -> None:
    """Maps one uid and gid into the user namespace just created (no setgroups, as unprivileged
    mappings require)."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{inside_uid} {outside_uid} 1"),
                       ("gid_map", f"{inside_gid} {outside_gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
