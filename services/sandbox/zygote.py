"""The sandbox's zygote and worker runtime, standard library only.

The service starts this file once as `python -I -S zygote.py CONFIG_JSON` with an empty
environment and one SOCK_SEQPACKET socket. At start the zygote
1. finds what the interpreter needs (isolation/rootfs.py) and builds the allowlisted root once,
   as a read-only template in a mount namespace of its own (inside a user namespace of its own
   when the service is not root);
2. prepares per-call cgroups where the hierarchy is writable (isolation/cgroups.py);
3. builds one worker the real way as a probe, and reports to the service whether calls can be
   isolated here (and why not, if not).
For every spawn request (a JSON spec plus two socket fds) it then forks a worker:
- root only: the worker joins its own memory and pids cgroups and becomes a uid of its own;
- it unshares user, mount, network, pid, ipc, uts and cgroup namespaces, mapping one
  unprivileged uid (1000 inside, its own uid outside), and forks the call's pid 1;
- pid 1 mounts its private /tmp and /proc into its copy of the template, pivots into it, sets
  rlimits, drops every capability, sets no_new_privs, installs the seccomp filter
  (isolation/seccomp.py), and only then says "ready" and reads code.
The forking process stays behind as a waiter: zygote, waiter and pid 1 each die with their
parent (PR_SET_PDEATHSIG), so nothing outlives the service, even a SIGKILLed one.

Where the kernel or the container runtime allows no namespaces, workers are not isolated and
the service refuses python unless `allow_insecure` is set; insecure workers still get rlimits,
a private temporary directory, no capabilities and the seccomp filter where it can be installed.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import resource
import signal
import socket
import sys
import traceback
from typing import NoReturn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the isolation package; there is no site-packages
from isolation import cgroups, libc, rootfs, seccomp  # noqa: E402

del sys.path[0]  # code in a worker must not find the service's own modules

CTL_FD = 3  # the worker's control socket (JSON lines both ways)
MB = 1024 * 1024
WORKER_NAMESPACES = (libc.CLONE_NEWUSER | libc.CLONE_NEWNS | libc.CLONE_NEWNET | libc.CLONE_NEWPID
                     | libc.CLONE_NEWIPC | libc.CLONE_NEWUTS | libc.CLONE_NEWCGROUP)
PROBE_TIMEOUT_SECONDS = 10.0

HOST_ROOT = os.geteuid() == 0  # root of the host, not of the zygote's own user namespace
FILTER = b""  # the worker's seccomp program, assembled once
CGROUP_BASES: dict[str, str] = {}
LIBRARY_PATH = ""  # LD_LIBRARY_PATH inside: where the bound shared libraries are


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return " ".join(text.split())[:300]


def _send(ctl: socket.socket, message: dict) -> None:
    ctl.sendall(json.dumps(message).encode() + b"\n")


def _die_with(parent_pid: int) -> None:
    """SIGKILL when the parent dies; armed after the last credential change (which clears it)."""
    libc.prctl(libc.PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the signal was armed
        os._exit(1)


# --- the zygote's own set-up ---------------------------------------------------------------


def _isolation(config: dict) -> dict:
    """Builds the template and probes one worker; returns what holds, for the service's log."""
    global FILTER, CGROUP_BASES, LIBRARY_PATH
    root = HOST_ROOT
    report = {"isolated": False, "mode": "root" if root else "user namespace", "reason": "",
              "proc": False, "cgroups": False, "seccomp": False}
    try:
        FILTER = seccomp.worker_filter()
        allow = rootfs.discover(config["import_paths"])
        CGROUP_BASES = cgroups.prepare(config["cgroup_tag"])
        _enter_own_namespaces(root)
        rootfs.build_template(allow)
    except Exception as exc:  # whatever failed, workers cannot be isolated: say why
        report["reason"] = f"cannot build the sandbox root: {_one_line(exc)}"
        return report
    LIBRARY_PATH = ":".join(sorted({os.path.dirname(f) for f in allow.files if ".so" in os.path.basename(f)}))
    report["cgroups"] = bool(CGROUP_BASES)
    probe = _probe({**config, **config["probe"]})
    if "failed" in probe:
        report["reason"] = f"cannot isolate a worker: {probe['failed']}"
        rootfs.leave_template()
    else:
        report.update(isolated=True, proc=probe["proc"], seccomp=True, allowlist=allow.as_dict())
    if not root:  # nothing the zygote does from here on needs its user namespace's capabilities
        libc.drop_capabilities()
    return report


def _enter_own_namespaces(root: bool) -> None:
    """A mount namespace for the template; without root, inside a user namespace mapping our uid
    (to the sandbox uid, not 0: a worker mapping its parent namespace's root would need
    CAP_SETFCAP there, which the zygote gives up)."""
    if root:
        libc.unshare(libc.CLONE_NEWNS)
        return
    uid, gid = os.geteuid(), os.getegid()
    libc.unshare(libc.CLONE_NEWUSER | libc.CLONE_NEWNS)
    libc.map_user(rootfs.SANDBOX_UID, rootfs.SANDBOX_GID, uid, gid)


def _probe(spec: dict) -> dict:
    """Builds one worker exactly as a call gets it; its ready message, or {"failed": reason}."""
    ctl, ctl_child = socket.socketpair()
    out, out_child = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ctl.close()
        out.close()
        _become_worker(spec, ctl_child.fileno(), out_child.fileno(), isolated=True)
    ctl_child.close()
    out_child.close()
    ctl.settimeout(PROBE_TIMEOUT_SECONDS)
    answer = {"failed": "the probe worker exited during set-up"}
    try:
        for line in ctl.makefile("rb"):
            message = json.loads(line)
            if "failed" in message or message.get("ready"):
                answer = message
                break
    except (OSError, ValueError) as exc:
        answer = {"failed": _one_line(exc)}
    finally:
        if "failed" in answer:
            os.kill(pid, signal.SIGKILL)  # its pid 1 dies with it
        ctl.close()  # a ready probe reads end-of-file and exits
        out.close()
        os.waitpid(pid, 0)
    return answer


# --- a worker ------------------------------------------------------------------------------


def _become_worker(spec: dict, ctl_fd: int, out_fd: int, isolated: bool) -> None:
    """Runs in the zygote's child: set up, say ready, then run code. Never returns."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
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
        ready = _isolated_worker(spec, ctl) if isolated else _insecure_worker(spec, ctl)
    except BaseException as exc:  # set-up failed: report it and never run code
        with contextlib.suppress(OSError):
            _send(ctl, {"failed": _one_line(exc)})
        os._exit(70)
    _serve_calls(ctl, ready)


def _become_uid(uid: int) -> None:
    """Root only: a uid of this worker's own, no groups, no capabilities outside."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # setuid made the process undumpable, which would hide /proc/self from it and from the
    # service's accounting; the pid namespace and the seccomp filter keep others out.
    libc.prctl(libc.PR_SET_DUMPABLE, 1)


def _isolated_worker(spec: dict, ctl: socket.socket) -> dict:
    """Namespaces, then the call's pid 1 (which returns here, set up); this process waits for it."""
    zygote = spec["zygote_pid"]
    if CGROUP_BASES and spec.get("cgroup"):
        cgroups.join_new(CGROUP_BASES, spec["cgroup"], spec["memory_mb"] * MB, spec["max_processes"] + 1)
    if HOST_ROOT:
        _become_uid(spec["uid"])
    uid, gid = os.geteuid(), os.getegid()
    libc.unshare(WORKER_NAMESPACES)
    libc.map_user(rootfs.SANDBOX_UID, rootfs.SANDBOX_GID, uid, gid)
    _die_with(zygote)
    alive, alive_writer = os.pipe()  # end-of-file on `alive`: this waiter has gone
    inner = os.fork()
    if inner == 0:
        os.close(alive_writer)
        return _become_pid1(spec, alive)
    _send(ctl, {"pid": inner})
    _wait_for(inner, keep=alive_writer)


def _wait_for(inner: int, keep: int) -> NoReturn:
    """The waiter: holds nothing but the pipe that tells pid 1 it lives, and no capabilities."""
    os.closerange(0, keep)
    os.closerange(keep + 1, 1 << 16)
    libc.drop_capabilities()
    while True:
        try:
            _pid, status = os.waitpid(inner, 0)
            break
        except InterruptedError:
            continue
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _become_pid1(spec: dict, alive: int) -> dict:
    """The call's pid 1: its root, limits, no capabilities, the filter; returns its ready message."""
    os.setsid()
    has_proc = rootfs.enter(spec["tmp_mb"], spec["tmp_inodes"])
    with contextlib.suppress(OSError):
        libc.sethostname("sandbox")
    _set_limits(spec)
    libc.drop_capabilities()
    libc.prctl(libc.PR_SET_NO_NEW_PRIVS, 1)
    seccomp.install(FILTER)
    libc.prctl(libc.PR_SET_PDEATHSIG, signal.SIGKILL)
    os.set_blocking(alive, False)
    try:
        os.read(alive, 1)
        os._exit(1)  # end-of-file: the waiter died before the signal was armed
    except BlockingIOError:
        os.close(alive)
    _prepare_interpreter(spec, "/tmp")
    return {"ready": True, "workdir": "/tmp", "proc": has_proc}


def _insecure_worker(spec: dict, ctl: socket.socket) -> dict:
    """Only with allow_insecure, where no namespaces exist: the host stays visible to the code."""
    import tempfile

    os.setsid()
    workdir = tempfile.mkdtemp(prefix="gearshift-sandbox-", dir=spec["fallback_tmp"])
    if HOST_ROOT:
        if CGROUP_BASES and spec.get("cgroup"):
            cgroups.join_new(CGROUP_BASES, spec["cgroup"], spec["memory_mb"] * MB, spec["max_processes"] + 1)
        os.chown(workdir, spec["uid"], spec["uid"])
        _become_uid(spec["uid"])
    _die_with(spec["zygote_pid"])
    _set_limits(spec)
    try:
        libc.drop_capabilities()
    except PermissionError:  # no CAP_SETPCAP to empty the bounding set: clear what we hold
        libc.clear_capabilities()
    libc.prctl(libc.PR_SET_NO_NEW_PRIVS, 1)
    filtered = _try_filter()
    _send(ctl, {"pid": os.getpid()})
    _prepare_interpreter(spec, workdir)
    return {"ready": True, "workdir": workdir, "proc": True, "seccomp": filtered}


def _try_filter() -> bool:
    try:
        seccomp.install(FILTER or seccomp.worker_filter())
        return True
    except OSError:
        return False


def _set_limits(spec: dict) -> None:
    limits = {
        resource.RLIMIT_CPU: (spec["cpu_seconds"], spec["cpu_seconds"] + 1),
        resource.RLIMIT_AS: (spec["memory_mb"] * MB,) * 2,
        resource.RLIMIT_FSIZE: (spec["file_mb"] * MB,) * 2,
        resource.RLIMIT_NPROC: (spec["max_processes"],) * 2,
        resource.RLIMIT_NOFILE: (spec["max_open_files"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    for which, (soft, hard) in limits.items():
        resource.setrlimit(which, (soft, hard))


def _prepare_interpreter(spec: dict, workdir: str) -> None:
    os.chdir(workdir)
    os.umask(0o077)
    os.environ.clear()
    os.environ.update(HOME=workdir, TMPDIR=workdir, PATH=os.path.dirname(os.path.realpath(sys.executable)), LANG="C.UTF-8")
    if LIBRARY_PATH:
        os.environ["LD_LIBRARY_PATH"] = LIBRARY_PATH
    sys.path[:] = [p for p in sys.path if p] + list(spec["import_paths"])
    if "random" in sys.modules:  # preloaded in the zygote: reseed so workers do not share draws
        sys.modules["random"].seed()


# --- running code --------------------------------------------------------------------------


def _last_expression_split(code: str):
    """Compiles code; a trailing expression is returned separately so its value can be shown."""
    tree = ast.parse(code, "<code>", "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, "<code>", "exec")
    return body, compile(last, "<code>", "eval") if last is not None else None


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


def _warm_up() -> None:
    """Runs what every call runs once, before saying ready: the pages it touches are copied
    from the zygote's now rather than during the first call."""
    _run("None", {"__builtins__": __builtins__})
    print(repr(json.loads(json.dumps({"ok": True, "error": "", "marked": True}))), file=io.StringIO())


def _serve_calls(ctl: socket.socket, ready: dict) -> None:
    """Says ready, then reads {"code", "marker", "keep"} lines and answers each with
    {"ok", "error", "marked"}. The service measures CPU time itself: nothing the code could
    forge is trusted."""
    lines = ctl.makefile("rb")
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8",
                                  errors="backslashreplace", write_through=True)
    sys.stderr = sys.stdout
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}

    def on_cpu_limit(_signum, _frame):
        _send(ctl, {"ok": False, "fatal": True, "error": "CPU time limit exceeded"})
        os._exit(1)

    signal.signal(signal.SIGXCPU, on_cpu_limit)
    _warm_up()
    _send(ctl, ready)
    while True:
        line = lines.readline()
        if not line:
            os._exit(0)
        request = json.loads(line)
        ok, error = _run(request["code"], namespace)
        try:
            sys.stdout.flush()
            os.write(1, request["marker"].encode())
            marked = True
        except (OSError, ValueError):  # the code closed its own stdout
            marked = False
        _send(ctl, {"ok": ok, "error": error, "marked": marked})
        # A one-off call's worker does not exit here: it waits (on the next read) for the service
        # to measure its CPU and kill it. Gone, its reaped children's time would go with it.


# --- the zygote ----------------------------------------------------------------------------


def _preload(modules: list[str]) -> None:
    for name in modules:
        try:
            __import__(name)
        except ImportError:
            pass


def main() -> None:
    config = json.loads(sys.argv[1])
    control = socket.socket(fileno=config["control_fd"])
    config["zygote_pid"] = os.getpid()
    report = _isolation(config)
    _die_with(config["service_pid"])  # never outlive the service
    libc.prctl(libc.PR_SET_CHILD_SUBREAPER, 1)  # adopt workers' orphans and reap them
    _preload(config.get("preload", []))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # reap workers without waiting on them
    control.send(json.dumps({"isolation": report, "cgroups": CGROUP_BASES, "pid": os.getpid()}).encode())
    isolated = report["isolated"]
    while True:
        message, fds, _flags, _addr = socket.recv_fds(control, 1 << 16, 2)
        if not message:
            return
        spec = {**config, **json.loads(message)}
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        if os.fork() == 0:
            try:
                if not isolated and not config["allow_insecure"]:
                    os.dup2(fds[0], CTL_FD)
                    _send(socket.socket(fileno=CTL_FD), {"failed": "python is disabled: no isolation here"})
                    os._exit(70)
                _become_worker(spec, fds[0], fds[1], isolated)
            finally:
                os._exit(70)
        for fd in fds:
            os.close(fd)


if __name__ == "__main__":
    main()
