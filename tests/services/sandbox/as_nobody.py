"""Runs a command as an unprivileged user, the way the chart's non-root sandbox pod runs it.

    python tests/services/sandbox/as_nobody.py [--mask-proc] [--deny-namespaces] -- COMMAND [ARG...]

Started as root, it enters a private mount namespace, makes the interpreter and this checkout
reachable for the unprivileged user (a directory others may not traverse, such as /root
holding pyenv, is covered by a tmpfs with only the needed paths bound back: what a container
image with python under /usr/local gives for free), then becomes uid and gid 65534 with no
groups and no capabilities. With --mask-proc it first covers a /proc file as container
runtimes do (runc binds /dev/null over /proc/kcore, /proc/timer_list, ...), after which the
kernel refuses the sandbox a fresh /proc. With --deny-namespaces it then installs a seccomp filter refusing
unshare, setns, mount, pivot_root and clone with namespace flags, as a container runtime's
default profile does to a pod without CAP_SYS_ADMIN. Then it execs the command.
Started without root it is unprivileged already and only applies --deny-namespaces.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import gearshift
from gearshift.services.sandbox.isolation import libc, seccomp

NOBODY = 65534
NAMESPACE_SETUP = ("unshare", "setns", "mount", "umount2", "pivot_root")


def _needed_paths() -> list[str]:
    """What the unprivileged process must reach: the interpreter, the virtual environment, the code."""
    checkout = Path(gearshift.__file__).resolve().parents[2]
    return sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, checkout)})


def _untraversable(path: str) -> str | None:
    """The outermost ancestor of path that others may not enter, if any."""
    parts = Path(path).parts
    for i in range(2, len(parts) + 1):
        ancestor = str(Path(*parts[:i]))
        if not os.stat(ancestor).st_mode & 0o001:
            return ancestor
    return None


def make_reachable(paths: list[str]) -> None:
    """Covers each untraversable ancestor with a tmpfs and binds the needed paths back into it."""
    libc.unshare(libc.CLONE_NEWNS)
    libc.mount(None, "/", None, libc.MS_REC | libc.MS_PRIVATE)
    blocked: dict[str, list[str]] = {}
    for path in paths:
        ancestor = _untraversable(path)
        if ancestor is not None:
            blocked.setdefault(ancestor, []).append(path)
    for ancestor, inside in blocked.items():
        handles = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in inside}
        libc.mount("tmpfs", ancestor, "tmpfs", libc.MS_NOSUID | libc.MS_NODEV, "size=64k,mode=0755")
        for path, fd in handles.items():
            os.makedirs(path, 0o755, exist_ok=True)
            libc.mount(f"/proc/self/fd/{fd}", path, None, libc.MS_BIND | libc.MS_REC)
            os.close(fd)


def mask_proc() -> None:
    """Like a container: a /proc with a file covered and no other proc mount beside it (the
    kernel allows a fresh proc only where some proc mount is fully visible)."""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[fields.index("-") + 1] == "proc" and fields[4] != "/proc":
            libc.umount(fields[4], libc.MNT_DETACH)  # in this private mount namespace only
    libc.mount("/dev/null", "/proc/timer_list", None, libc.MS_BIND)


def become_nobody() -> None:
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)  # leaving uid 0 clears every capability


def deny_namespaces() -> None:
    libc.prctl(libc.PR_SET_NO_NEW_PRIVS, 1)
    seccomp.install(seccomp.program(NAMESPACE_SETUP, clone_namespaces=False, socket_families=None))


def main(argv: list[str]) -> None:
    if "--" not in argv:
        sys.exit(__doc__)
    options, command = argv[: argv.index("--")], argv[argv.index("--") + 1:]
    if os.geteuid() == 0:
        make_reachable(_needed_paths())
        if "--mask-proc" in options:
            mask_proc()
        become_nobody()
    if "--deny-namespaces" in options:
        deny_namespaces()
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
