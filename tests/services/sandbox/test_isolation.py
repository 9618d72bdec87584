"""What a python call can see and do, checked from inside the sandbox against the host seen from
here (the tests run as root), in both modes: no host socket reachable, a filesystem holding only
the allowlist, a mount table of the sandbox's own mounts, no privileges; the zygote and workers
die with a SIGKILLed service; without namespaces python is refused unless allowed insecurely."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import gearshift
import grpc
import pytest
from gearshift.api.sandbox.v1 import sandbox_pb2

from tests.services.sandbox.conftest import SMALL_LIMITS, RunningSandbox, call, run_python, service_process

STDLIB = os.path.dirname(os.__file__)  # the same interpreter's standard library
INTERPRETER = os.path.realpath(sys.executable)
CHECKOUT = str(Path(gearshift.__file__).resolve().parents[2])
WELL_KNOWN_SOCKETS = [
    "/var/run/postgresql/.s.PGSQL.5432", "/run/postgresql/.s.PGSQL.5432", "/tmp/.s.PGSQL.5432",
    "/var/run/redis/redis-server.sock", "/run/redis/redis-server.sock", "/var/run/redis/redis.sock", "/tmp/redis.sock",
    "/var/run/mysqld/mysqld.sock", "/run/mysqld/mysqld.sock", "/tmp/mysql.sock", "/var/lib/mysql/mysql.sock",
    "/run/mariadb/mariadb.sock",
    "/var/run/docker.sock", "/run/docker.sock", "/run/user/0/docker.sock",
    "/run/containerd/containerd.sock", "/run/containerd/containerd.sock.ttrpc", "/var/run/containerd/containerd.sock",
    "/var/lib/rabbitmq/.erlang.cookie", "/var/run/rabbitmq/rabbitmq.sock", "/run/rabbitmq/rabbitmq.sock",
    "/tmp/nats.sock", "/var/run/nats/nats.sock", "/run/nats.sock",
    "/run/mosquitto/mosquitto.sock", "/var/run/mosquitto/mosquitto.sock", "/tmp/mosquitto.sock",
    "/run/systemd/private", "/run/systemd/journal/socket", "/run/dbus/system_bus_socket",
]

TRY_EVERY_SOCKET = """
import json, socket
reached = []
for name in json.loads(NAMES):
    address = "\\0" + name[1:] if name.startswith("@") else name
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM, socket.SOCK_SEQPACKET):
        s = socket.socket(socket.AF_UNIX, kind)
        s.settimeout(0.5)
        try:
            s.connect(address)
            reached.append(name)
        except OSError:
            pass
        finally:
            s.close()
print("tried", len(json.loads(NAMES)), "reached", reached)
"""

WALK_FROM_ROOT = """
import json, os, stat
found = []
for top, dirs, files in os.walk("/"):
    if top in ("/proc", STDLIB):  # a fresh proc; the standard library is listed apart below
        dirs[:] = []
        continue
    for name in dirs + files:
        path = os.path.join(top, name)
        mode = os.lstat(path).st_mode
        kind = "d" if stat.S_ISDIR(mode) else "l" if stat.S_ISLNK(mode) else "f" if stat.S_ISREG(mode) else \\
            "c" if stat.S_ISCHR(mode) else "s" if stat.S_ISSOCK(mode) else "?"
        found.append([path, kind])
kinds = sorted({stat.S_IFMT(os.lstat(os.path.join(top, n)).st_mode) for top, _, names in os.walk(STDLIB) for n in names})
print(json.dumps({"entries": found, "stdlib_kinds": kinds, "site_packages": os.listdir(STDLIB + "/site-packages")}))
"""


def host_sockets(canaries: list[str]) -> list[str]:
    """Every socket on the host: files (find -xdev from / and the usual runtime places), the
    well-known paths, and abstract sockets (listed by the kernel as @name)."""
    found = set(WELL_KNOWN_SOCKETS) | set(canaries)
    for top in ("/", "/run", "/var/run", "/tmp", "/dev/shm"):
        # A cold walk of a CI machine's disk (a virtualenv with torch and vLLM) took over a minute.
        listing = subprocess.run(["find", top, "-xdev", "-type", "s"], capture_output=True, text=True, timeout=600)
        found |= {line for line in listing.stdout.splitlines() if line}
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) == 8:
            found.add(fields[7])
    return sorted(found)


@pytest.fixture(scope="module")
def host_socket_names(canaries) -> list[str]:
    """Listed once for both modes: the host's sockets do not depend on the sandbox's mode."""
    return host_sockets(canaries)


@pytest.fixture(scope="module")
def canaries():
    """A listening socket file and an abstract socket of our own, so the host has some to find."""
    directory = tempfile.mkdtemp(prefix="gs-canary-")
    os.chmod(directory, 0o755)
    path_listener = socket.socket(socket.AF_UNIX)
    path_listener.bind(f"{directory}/canary.sock")
    os.chmod(f"{directory}/canary.sock", 0o777)
    abstract_listener = socket.socket(socket.AF_UNIX)
    abstract_name = f"gs-canary-{uuid.uuid4().hex[:8]}"
    abstract_listener.bind("\0" + abstract_name)
    for listener in (path_listener, abstract_listener):
        listener.listen()
    yield [f"{directory}/canary.sock", f"@{abstract_name}"]
    path_listener.close()
    abstract_listener.close()
    shutil.rmtree(directory, ignore_errors=True)


async def test_no_host_socket_can_be_opened(service: RunningSandbox, canaries, host_socket_names):
    names = host_socket_names
    assert "/run/postgresql/.s.PGSQL.5432" in names and len(names) > len(WELL_KNOWN_SOCKETS)
    for canary in canaries:  # reachable from here, so unreachable means the sandbox stopped it
        with socket.socket(socket.AF_UNIX) as probe:
            probe.connect("\0" + canary[1:] if canary.startswith("@") else canary)
    code = TRY_EVERY_SOCKET.replace("NAMES", repr(json.dumps(names)))
    result = await run_python(service.stub, code, timeout=8.0)
    assert not result.is_error, result.error
    assert result.output == f"tried {len(names)} reached []\n"


async def test_the_filesystem_holds_only_the_allowlist(service: RunningSandbox):
    result = await run_python(service.stub, WALK_FROM_ROOT.replace("STDLIB", repr(STDLIB)), timeout=8.0)
    assert not result.is_error, result.error
    seen = json.loads(result.output)
    entries = dict(seen["entries"])
    assert seen["site_packages"] == [] and set(seen["stdlib_kinds"]) <= {stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK}
    assert {p for p in entries if p.startswith("/etc/")} == {f"/etc/{n}" for n in ("passwd", "group", "hosts", "nsswitch.conf")}
    assert {p for p in entries if p.startswith("/dev/")} == {f"/dev/{n}" for n in ("null", "zero", "urandom", "fd", "stdin", "stdout", "stderr")}
    assert [p for p in entries if p.startswith("/tmp/")] == []
    assert {k for p, k in entries.items() if p.startswith("/dev/")} == {"c", "l"}
    assert set(entries.values()) <= {"d", "l", "f", "c"}  # no socket, fifo or other node anywhere
    host_only = ["/run", "/var", "/home", "/srv", "/opt", "/mnt", "/media", "/boot", "/sys", "/work", CHECKOUT,
                 str(service.settings.data_dir), "/root/.bash_history", "/root/.ssh"]
    assert [p for p in host_only if p in entries] == []
    for path, kind in entries.items():
        if kind == "f" and not path.startswith("/etc/"):
            assert _interpreter_file(path), path
        if kind == "c":
            assert path in ("/dev/null", "/dev/zero", "/dev/urandom"), path


async def test_the_mount_table_shows_only_the_sandbox_mounts(service: RunningSandbox):
    result = await run_python(service.stub, "import os\n"
                              "print(open('/proc/self/mountinfo').read() if os.path.exists('/proc/self') else 'no /proc')")
    assert not result.is_error, result.error
    if result.output == "no /proc\n":  # a runtime that masks its own /proc: no mount table to read at all
        assert os.path.exists("/proc/timer_list") and _proc_is_masked()
        return
    mounts = {}
    for line in result.output.splitlines():
        if line:
            fields = line.split()
            mounts[fields[4]] = (fields[5].split(","), fields[fields.index("-") + 1])
    assert mounts["/"][1] == "tmpfs" and mounts["/tmp"][1] == "tmpfs" and mounts["/proc"][1] == "proc"
    assert [point for point, (options, _) in mounts.items() if "ro" not in options] == ["/tmp"]
    for point in mounts:
        allowed = (point in ("/", "/tmp", "/proc", "/dev/null", "/dev/zero", "/dev/urandom")
                   or point == STDLIB or point.startswith(STDLIB + "/") or _interpreter_file(point))
        assert allowed, f"unexpected mount {point}"
    assert len(mounts) < 100


def _interpreter_file(path: str) -> bool:
    """The interpreter, or what the loader maps for it: shared libraries and libc's locale data."""
    name = os.path.basename(path)
    return path == INTERPRETER or ".so" in name or "/locale/" in path or "gconv" in name


PRIVILEGES = """
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
sets = (Data * 2)()
libc.capget(ctypes.byref(Header(0x20080522, 0)), sets)
print("capabilities", sum(s.effective | s.permitted | s.inheritable for s in sets))
print("bounding", sum(libc.prctl(23, cap, 0, 0, 0) == 1 for cap in range(64)))  # PR_CAPBSET_READ
print("no_new_privs", libc.prctl(39, 0, 0, 0, 0), "seccomp", libc.prctl(21, 0, 0, 0, 0))  # PR_GET_*
print("pid", os.getpid(), "uid", os.getuid(), os.getgid(), os.getgroups(), socket.gethostname())
"""


async def test_the_code_holds_no_privileges(service: RunningSandbox):
    result = await run_python(service.stub, PRIVILEGES)  # through system calls: /proc may be absent
    assert not result.is_error, result.error
    assert result.output == "capabilities 0\nbounding 0\nno_new_privs 1 seccomp 2\npid 1 uid 1000 1000 [] sandbox\n"


def _proc_is_masked() -> bool:
    """Whether this process's /proc has something mounted over it, as container runtimes do."""
    return any(line.split()[4].startswith("/proc/") for line in Path("/proc/self/mountinfo").read_text().splitlines())


@pytest.mark.parametrize("mode", ["root", "unprivileged"])
async def test_the_zygote_and_its_workers_die_with_a_killed_service(mode):
    async with service_process(unprivileged=mode == "unprivileged") as running:
        session = await run_python(running.stub, "import subprocess, sys\n"
                                   "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])", session_id="s",
                                   open_session=True)
        assert not session.is_error, session.error
        descendants = await _descendants_when(running.pid, at_least=1 + 2 * (SMALL_LIMITS["warm_workers"] + 1) + 1)
        os.kill(running.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(pid) for pid in descendants):
            await asyncio.sleep(0.1)
        assert [pid for pid in descendants if _alive(pid)] == []


async def _descendants_when(pid: int, at_least: int) -> list[int]:
    """The service's descendants, once there are at least this many (zygote, waiters, workers)."""
    deadline = time.monotonic() + 20
    while True:
        found, pending = [], [pid]
        while pending:
            current = pending.pop()
            for task in Path(f"/proc/{current}/task").glob("*"):
                children = [int(c) for c in (task / "children").read_text().split()] if (task / "children").exists() else []
                found += children
                pending += children
        if len(found) >= at_least or time.monotonic() > deadline:
            assert len(found) >= at_least, f"only {len(found)} descendants"
            return found
        await asyncio.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_where_the_runtime_masks_proc_calls_run_without_one():
    async with service_process(unprivileged=True, mask_proc=True, warm_workers=1) as running:
        result = await run_python(running.stub, "import os, subprocess, sys\nprint(os.listdir('/proc'))\n"
                                  "print(subprocess.run([sys.executable, '-c', 'print(6 * 7)'], capture_output=True, text=True).stdout)")
        assert not result.is_error, result.output
        assert result.output == "[]\n42\n\n"
        spin = await run_python(running.stub, "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end:\n    pass")
        assert not spin.is_error and spin.cpu_seconds >= 0.25
        assert "/proc absent" in running.log.read_text()


async def test_without_namespaces_python_is_refused_and_the_rest_still_works():
    async with service_process(unprivileged=True, deny_namespaces=True, warm_workers=1) as running:
        result = await run_python(running.stub, "print(1)")
        assert result.is_error and result.error.startswith("python is disabled: the sandbox cannot isolate code")
        assert "Operation not permitted" in result.error and "\n" not in result.error
        session = await run_python(running.stub, "print(1)", session_id="s", open_session=True)
        assert session.is_error and session.error == result.error
        search = await call(running.stub, "web_search", {"query": "penicillin"})
        assert not search.is_error and "Alexander Fleming" in search.output
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(running.stub, "shell", {"cmd": "id"})
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "python calls are refused" in running.log.read_text()


async def test_allow_insecure_runs_python_unisolated_and_says_so_loudly():
    async with service_process(unprivileged=True, deny_namespaces=True, warm_workers=1, allow_insecure=True) as running:
        result = await run_python(running.stub, "import os, socket\nprint(os.getcwd(), os.getuid())\n"
                                  "socket.socket(socket.AF_INET)")
        workdir, uid = result.output.split("\n")[0].split()
        assert Path(workdir).name.startswith("gearshift-sandbox-") and int(uid) == 65534
        assert result.is_error and "Address family not supported" in result.error  # the seccomp filter still holds
        assert "CRITICAL" in running.log.read_text() and "INSECURE: python code runs WITHOUT isolation" in running.log.read_text()
        await asyncio.sleep(0.2)
        assert not Path(workdir).exists()  # removed with its worker
        closed = await running.stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id="none"))
        assert not closed.closed


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting on the host needs root")
@pytest.mark.parametrize("unprivileged", [False, True], ids=["root", "unprivileged"])
async def test_a_host_mount_under_tmp_does_not_stop_the_root_being_built(unprivileged):
    """A chroot under /tmp with its own /proc (debootstrap leaves one while it runs) lies beneath
    the template's tmpfs; the template is built around it, and the call cannot see it."""
    chroot = tempfile.mkdtemp(prefix="gs-chroot-")
    os.chmod(chroot, 0o755)
    os.mkdir(f"{chroot}/proc")
    subprocess.run(["mount", "-t", "proc", "proc", f"{chroot}/proc"], check=True)
    try:
        async with service_process(unprivileged=unprivileged, warm_workers=1) as running:
            result = await run_python(running.stub, f"import os\nprint(6 * 7, os.path.exists({chroot!r}))")
            assert not result.is_error, result.error
            assert result.output == "42 False\n"
    finally:
        subprocess.run(["umount", "-l", f"{chroot}/proc"], check=True)
        shutil.rmtree(chroot, ignore_errors=True)
