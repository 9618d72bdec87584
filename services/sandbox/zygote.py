"""The sandbox's zygote and worker runtime, standard library only.

The service starts this file once as `python -I -S zygote.py CONFIG_JSON` with an empty
environment and one SOCK_SEQPACKET socket on fd 3. For every spawn request (a JSON spec plus two
socket fds) the zygote forks; the child isolates itself completely (namespaces, read-only
mounts, rlimits, a dropped uid) before it says "ready" and only then reads code. So untrusted
code never runs in the zygote, and a warm worker costs a fork instead of an interpreter start.

What holds (when the service runs as root on Linux, the case this is built for):
- new network namespace: only a downed loopback, so every connect fails;
- new pid namespace: the worker is pid 1 of its own namespace, sees only its own processes in
  a fresh /proc, and killing it (from outside) kills everything it started;
- new mount namespace: every mount read-only, the service's own paths hidden under empty
  tmpfs, a private size- and inode-capped tmpfs on /tmp as the only writable place;
- a uid of its own (no passwd entry, no capabilities, no_new_privs), so it cannot signal,
  ptrace or read other workers or the service, and RLIMIT_NPROC counts only its own processes;
- rlimits on CPU seconds, address space, file size, processes, open files; no core dumps.
Without root some of these cannot be had; the zygote probes and reports what holds, the
service logs it, and the fallback for the network is a socket guard inside the interpreter that
ctypes can defeat (said so in the log).
"""

from __future__ import annotations

import ast
import ctypes
import io
import json
import os
import resource
import signal
import socket
import sys
import traceback

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MOUNT_FLAGS = {
    "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME, "relatime": MS_RELATIME,
}
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38
O_PATH = getattr(os, "O_PATH", 0o10000000)

CTL_FD = 3  # the worker's control socket (JSON lines both ways)
WORKDIR = "/tmp"

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _prctl(option: int, value: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl {option}")


# --- isolation -----------------------------------------------------------------------------


def probe(namespaces: bool = True) -> dict:
    """What isolation this machine allows, tried in a throwaway child (namespaces=False skips them)."""
    checks = {"net_ns": CLONE_NEWNET, "mount_ns": CLONE_NEWNS, "pid_ns": CLONE_NEWPID}
    found = {}
    for name, flag in checks.items():
        if not namespaces:
            found[name] = False
            continue
        pid = os.fork()
        if pid == 0:
            os._exit(0 if _libc.unshare(flag) == 0 else 1)
        found[name] = os.waitpid(pid, 0)[1] == 0
    found["setuid"] = os.geteuid() == 0
    found["mount_ns"] = found["mount_ns"] and found["setuid"]
    return found


def _mountinfo() -> list[tuple[str, int]]:
    """(mount point, preserved flags) of every mount in this namespace."""
    mounts = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # \040 for spaces
            flags = 0
            for option in fields[5].split(","):
                flags |= MOUNT_FLAGS.get(option, 0)
            mounts.append((point, flags))
    return mounts


def _setup_mounts(spec: dict) -> None:
    """Read-only view of the machine, hidden service paths, a private /tmp and /proc."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    keep = [p for p in spec["keep_paths"] if os.path.isdir(p)]
    keep_fds = {p: os.open(p, O_PATH | os.O_DIRECTORY) for p in keep}
    for hidden in spec["hidden_paths"]:
        if not os.path.isdir(hidden) or os.path.realpath(hidden) == "/":
            continue
        _mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=0755")
        for path, fd in keep_fds.items():
            if path == hidden or path.startswith(hidden.rstrip("/") + "/"):
                os.makedirs(path, exist_ok=True)
                _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    for fd in keep_fds.values():
        os.close(fd)
    for point, flags in _mountinfo():
        try:
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | flags)
        except OSError:
            if point == "/":
                raise
    uid = spec["uid"]
    _mount("tmpfs", WORKDIR, "tmpfs", MS_NOSUID | MS_NODEV,
           f"size={spec['tmp_mb']}m,nr_inodes={spec['tmp_inodes']},mode=0700,uid={uid},gid={uid}")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _set_limits(spec: dict) -> None:
    mb = 1024 * 1024
    limits = {
        resource.RLIMIT_CPU: (spec["cpu_seconds"], spec["cpu_seconds"] + 1),
        resource.RLIMIT_AS: (spec["memory_mb"] * mb,) * 2,
        resource.RLIMIT_FSIZE: (spec["file_mb"] * mb,) * 2,
        resource.RLIMIT_NPROC: (spec["max_processes"],) * 2,
        resource.RLIMIT_NOFILE: (spec["max_open_files"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for which, (soft, hard) in limits.items():
        resource.setrlimit(which, (soft, hard))


def _send(ctl: socket.socket, message: dict) -> None:
    ctl.sendall(json.dumps(message).encode() + b"\n")


def _become_worker(spec: dict, ctl_fd: int, out_fd: int, found: dict) -> None:
    """Runs in the forked child: isolate, say ready, then run code. Never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    # stdin from /dev/null, stdout and stderr into the output socket, control on fd 3,
    # and nothing else open: above all not the zygote's own socket.
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.dup2(ctl_fd, CTL_FD)
    os.closerange(CTL_FD + 1, 1 << 16)
    ctl = socket.socket(fileno=CTL_FD)
    try:
        _isolate(spec, ctl, found)
    except BaseException as exc:  # isolation failed: report it and never run code
        _send(ctl, {"failed": _one_line(exc)})
        os._exit(70)
    _serve_calls(ctl)


def _isolate(spec: dict, ctl: socket.socket, found: dict) -> None:
    """Namespaces, mounts, limits, uid, environment; ends by telling the service it is ready."""
    flags = (CLONE_NEWNET if found["net_ns"] else 0) | (CLONE_NEWPID if found["pid_ns"] else 0)
    flags |= CLONE_NEWNS if found["mount_ns"] else 0
    if flags:
        _check(_libc.unshare(flags), "unshare")
    if found["pid_ns"]:
        inner = os.fork()  # the first child in the new namespace becomes its pid 1
        if inner:
            _send(ctl, {"pid": inner})
            os._exit(0)
        os.setsid()
    else:
        _send(ctl, {"pid": os.getpid()})

    if found["mount_ns"]:
        _setup_mounts(spec)
        workdir = WORKDIR
    else:
        import tempfile

        workdir = tempfile.mkdtemp(prefix="gearshift-sandbox-", dir=spec["fallback_tmp"])
        if found["setuid"]:
            os.chown(workdir, spec["uid"], spec["uid"])
    os.chdir(workdir)
    _set_limits(spec)
    if found["setuid"]:
        os.setgroups([])
        os.setgid(spec["uid"])
        os.setuid(spec["uid"])
    _prctl(PR_SET_NO_NEW_PRIVS, 1)
    os.umask(0o077)
    os.environ.clear()
    os.environ.update(HOME=workdir, TMPDIR=workdir, PATH="/usr/local/bin:/usr/bin:/bin", LANG="C.UTF-8")
    sys.path[:] = [p for p in sys.path if p] + list(spec["import_paths"])
    if not found["net_ns"]:
        _guard_sockets()
    if "random" in sys.modules:  # preloaded in the zygote: reseed so workers do not share draws
        sys.modules["random"].seed()
    _send(ctl, {"ready": True, "workdir": workdir})


def _guard_sockets() -> None:
    """Fallback without a network namespace: refuse sockets in Python. ctypes can bypass this."""
    import _socket

    def refuse(*_args, **_kwargs):
        raise PermissionError("network access is disabled in the sandbox")

    _socket.socket = refuse
    socket.socket = refuse
    socket.create_connection = refuse
    socket.socketpair = refuse


# --- running code --------------------------------------------------------------------------


def _last_expression_split(code: str):
    """Compiles code; a trailing expression is returned separately so its value can be shown."""
    tree = ast.parse(code, "<code>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, "<code>", "exec")
    return body, compile(last, "<code>", "eval") if last is not None else None


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return " ".join(text.split())[:300]


def _print_user_traceback(exc: BaseException) -> None:
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != "<code>":
        tb = tb.tb_next  # drop the runner's own frames
    traceback.print_exception(type(exc), exc, tb)


def _run(code: str, namespace: dict) -> tuple[bool, str]:
    try:
        body, last = _last_expression_split(code)
        exec(body, namespace)
        if last is not None:
            value = eval(last, namespace)
            if value is not None:
                print(repr(value))
        return True, ""
    except SystemExit as exc:
        if exc.code in (None, 0):
            return True, ""
        return False, f"SystemExit: {exc.code}"
    except BaseException as exc:  # everything the code raises is the caller's result
        _print_user_traceback(exc)
        return False, _one_line(exc)


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _serve_calls(ctl: socket.socket) -> None:
    """Reads {"code", "marker", "keep"} lines; answers each with {"ok", "error", "cpu"}."""
    lines = ctl.makefile("rb")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stderr = sys.stdout
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}

    def on_cpu_limit(_signum, _frame):
        _send(ctl, {"ok": False, "fatal": True, "error": "CPU time limit exceeded", "cpu": _cpu_seconds()})
        os._exit(1)

    signal.signal(signal.SIGXCPU, on_cpu_limit)
    while True:
        line = lines.readline()
        if not line:
            os._exit(0)
        request = json.loads(line)
        start = _cpu_seconds()
        ok, error = _run(request["code"], namespace)
        try:
            sys.stdout.flush()
            os.write(1, request["marker"].encode())
            marked = True
        except (OSError, ValueError):  # the code closed its own stdout
            marked = False
        _send(ctl, {"ok": ok, "error": error, "cpu": _cpu_seconds() - start, "marked": marked})
        if not request.get("keep"):
            os._exit(0)


# --- the zygote ----------------------------------------------------------------------------


def _preload(modules: list[str]) -> None:
    for name in modules:
        try:
            __import__(name)
        except ImportError:
            pass


def main() -> None:
    config = json.loads(sys.argv[1])
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # never outlive the service
    _prctl(PR_SET_CHILD_SUBREAPER, 1)  # adopt workers' pid-1 processes and reap them
    control = socket.socket(fileno=config["control_fd"])
    found = probe(config.get("namespaces", True))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # reap workers without waiting on them
    _preload(config.get("preload", []))
    control.send(json.dumps({"isolation": found, "pid": os.getpid()}).encode())
    while True:
        message, fds, _flags, _addr = socket.recv_fds(control, 1 << 16, 2)
        if not message:
            return
        spec = json.loads(message)
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            try:
                _become_worker({**config, **spec}, fds[0], fds[1], found)
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    main()
