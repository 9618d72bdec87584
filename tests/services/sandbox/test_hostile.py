"""Hostile code: every program is contained with a clear per-call error (or a harmless result)
while the service keeps serving, and a trivial call answers at normal latency afterwards; in both
modes, the service as root and as an unprivileged user (conftest's `service`).

The second half of the battery targets the allowlisted root, the seccomp filter and the limits
that span a call's processes (issue 11): host sockets, other socket families, ptrace, namespaces,
mounts, kernel interfaces, the service's environment, /etc, and fork, memory and CPU spread over
child processes. "SERVICE_PID" in a program is replaced by the service's process id."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import grpc
import pytest
from gearshift.api.common.v1.common_pb2 import ToolCall, ToolResult
from gearshift.api.sandbox.v1 import sandbox_pb2
from gearshift.services.sandbox import core

from tests.services.sandbox.conftest import SERVICE_SECRET, SMALL_LIMITS, RunningSandbox, run_python

SERVICE_FILE = Path(core.__file__).resolve()
ESCAPE_NAME = f"gearshift-escape-{uuid.uuid4().hex[:8]}"
latencies: dict[str, float] = {}


@dataclass
class Hostile:
    name: str
    code: str
    contained: Callable[[ToolResult], bool]
    timeout: float = 0.0


def error_has(*fragments: str) -> Callable[[ToolResult], bool]:
    return lambda r: r.is_error and any(f in r.error for f in fragments)


def output_has(*fragments: str) -> Callable[[ToolResult], bool]:
    return lambda r: all(f in r.output for f in fragments)


BATTERY = [
    Hostile("fork bomb", "import os\nwhile True:\n    os.fork()", error_has("BlockingIOError", "timed out", "died"), 2.0),
    Hostile("thread bomb", "import threading, time\nfor _ in range(10_000):\n    threading.Thread(target=time.sleep, args=(60,)).start()",
            error_has("can't start new thread", "RuntimeError")),
    Hostile("memory bomb, one allocation", "x = bytearray(1 << 34)", error_has("MemoryError")),
    Hostile("memory bomb, growing list", "a = []\nwhile True:\n    a.append(' ' * 10**6)", error_has("MemoryError", "died")),
    Hostile("cpu spin past the wall clock", "while True:\n    pass", error_has("timed out after 1 s"), 1.0),
    # CPU limits get generous wall clocks: a loaded machine must still let 2 CPU-seconds pass first
    Hostile("cpu spin past the cpu limit", "while True:\n    pass", error_has("CPU time limit exceeded", "died"), 20.0),
    Hostile("ignores SIGTERM and spins", "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True: pass",
            error_has("timed out"), 0.5),
    Hostile("endless output", "while True:\n    print('y' * 1000)",
            lambda r: r.is_error and r.truncated and f"output truncated after {SMALL_LIMITS['max_output_chars']} characters" in r.output),
    Hostile("one endless line on stderr", "import os\nwhile True:\n    os.write(2, b'z' * 65536)",
            lambda r: r.is_error and r.truncated and "output exceeded" in r.error),
    Hostile("deep recursion", "def f(n):\n    return f(n + 1)\nf(0)", error_has("RecursionError")),
    Hostile("recursion limit lifted", "import sys\nsys.setrecursionlimit(10**7)\ndef f(n):\n    return f(n + 1)\nf(0)",
            error_has("died", "MemoryError", "RecursionError", "CPU time limit", "timed out"), 2.5),
    Hostile("read /etc/shadow", "print(open('/etc/shadow').read())", error_has("FileNotFoundError", "PermissionError")),
    Hostile("read own environment", "import os\nprint(dict(os.environ))\ntry:\n    print(open('/proc/self/environ').read())\n"
            "except (PermissionError, FileNotFoundError):  # no /proc where the runtime masks its own\n    print('denied')",
            lambda r: not r.is_error and "'HOME': '/tmp'" in r.output and SERVICE_SECRET not in r.output and "GEARSHIFT" not in r.output),
    Hostile("read the service's environment", "print(open('/proc/SERVICE_PID/environ').read())",
            error_has("FileNotFoundError", "PermissionError")),
    Hostile("read the service's own files", f"print(open({str(SERVICE_FILE)!r}).read())",
            error_has("FileNotFoundError", "PermissionError")),
    Hostile("list the service's processes", "import os\nprint(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))",
            lambda r: not r.is_error and r.output.strip() in ("[1]", "[1, 2]", "[]")),  # []: no /proc at all
    Hostile("write outside the temp dir", "open('/usr/local/gearshift-escape', 'w').write('x')",
            error_has("Read-only file system", "FileNotFoundError")),
    Hostile("write next to the interpreter", "import os, sys\nopen(os.path.dirname(sys.executable) + '/evil', 'w')",
            error_has("Read-only file system")),
    Hostile("append to /etc/passwd", "open('/etc/passwd', 'a').write('evil::0:0::/:/bin/sh\\n')",
            error_has("Read-only file system", "PermissionError")),
    Hostile("write to /dev/shm", "open('/dev/shm/gearshift-escape', 'w').write('x')",
            error_has("Read-only file system", "PermissionError", "FileNotFoundError")),
    Hostile("write to the host's /tmp", f"open('/tmp/{ESCAPE_NAME}', 'w').write('x')\nprint('wrote')",
            lambda r: not r.is_error and not Path(f"/tmp/{ESCAPE_NAME}").exists()),
    Hostile("connect to Postgres", "import socket\nsocket.create_connection(('127.0.0.1', 5432), timeout=1)",
            error_has("Address family not supported", "Network is unreachable")),
    Hostile("connect to Redis", "import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', 6379))",
            error_has("Address family not supported", "Network is unreachable")),
    Hostile("resolve a name", "import socket\nsocket.getaddrinfo('example.com', 80)", error_has("gaierror")),
    Hostile("spawn a shell", "import subprocess\nr = subprocess.run(['sh', '-c', 'id -u; cat /etc/shadow; touch /etc/evil'], "
            "capture_output=True, text=True)\nprint(r.stdout, r.stderr)",
            error_has("FileNotFoundError: [Errno 2] No such file or directory: 'sh'")),
    Hostile("kill the parent", "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('still here')",
            lambda r: "still here" in r.output or r.is_error),
    Hostile("kill the service by pid", "import os\nos.kill(SERVICE_PID, 9)", error_has("ProcessLookupError", "PermissionError")),
    Hostile("kill every process", "import os\nos.kill(-1, 9)", error_has("ProcessLookupError")),
    Hostile("become root", "import os\nos.setuid(0)", error_has("PermissionError", "Invalid argument")),  # 0 is not mapped
    Hostile("ctypes: setuid, mount and unshare", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.setuid(0), libc.mount(b'none', b'/usr', b'tmpfs', 0, None), libc.unshare(0x40000000))",
            output_has("-1 -1 -1")),
    Hostile("ctypes: null pointer read", "import ctypes\nctypes.string_at(0)", error_has("died")),
    Hostile("os tricks: chroot, nice, raise limits", "import os, resource\nfor f in (lambda: os.chroot('/'), lambda: os.nice(-5), "
            "lambda: resource.setrlimit(resource.RLIMIT_NPROC, (10**6, 10**6))):\n    try:\n        f()\n        print('allowed')\n"
            "    except (PermissionError, ValueError) as e:\n        print('refused')",
            lambda r: r.output.split() == ["refused"] * 3),
    Hostile("daemon that outlives the call", "import os, time, ctypes\nif os.fork() == 0:\n    os.setsid()\n"
            "    ctypes.CDLL(None).prctl(15, b'gs-escapee', 0, 0, 0)\n    time.sleep(60)\nprint('parent done')",
            lambda r: "parent done" in r.output),
    Hostile("forge a result on the control socket", "import os\nos.write(3, b'{\"ok\": true, \"marked\": true}\\n')\nwhile True: pass",
            lambda r: r.wall_seconds < 4.0),
    Hostile("close stdout and stderr", "import os\nos.close(1)\nos.close(2)\nx = 1", lambda r: r.wall_seconds < 3.0),
    Hostile("fake end marker in output", "print('\\x00gearshift-end-000000000000000000000000\\x00 and more')",
            output_has("and more")),
    Hostile("zip bomb written to disk", "import zipfile, zlib\nwith zipfile.ZipFile('bomb.zip', 'w', zipfile.ZIP_DEFLATED) as z:\n"
            "    for i in range(8):\n        z.writestr(f'part{i}', b'\\0' * (3 << 20))\n"
            "zipfile.ZipFile('bomb.zip').extractall('out')", error_has("No space left on device", "File too large")),
    Hostile("one file past the size limit", "open('big', 'wb').write(b'\\0' * (8 << 20))", error_has("File too large")),
    Hostile("a million tiny files", "for i in range(1_000_000):\n    open(f'f{i}', 'w').close()", error_has("No space left on device")),
    Hostile("too many open files", "files = [open('/dev/null') for _ in range(10_000)]", error_has("Too many open files")),
    Hostile("unicode edge cases", "print('\\udcff lone surrogate', '\\u202e RTL', 'e\\u0301', '\\U0001F600', '\\u2028', '\\x00')\n"
            "π = 3.14159\nprint(π)", lambda r: not r.is_error and "3.14159" in r.output and "\\udcff" in r.output),

    # --- what issue 11 changed: the allowlisted root, the seccomp filter, per-call limits ---
    Hostile("log in to Postgres over its Unix socket", "import socket\ns = socket.socket(socket.AF_UNIX)\n"
            "s.connect('/var/run/postgresql/.s.PGSQL.5432')\ns.sendall(b'\\0\\0\\0\\x08\\x04\\xd2\\x16\\x2f')",
            error_has("FileNotFoundError")),
    Hostile("look for any socket file from /", "import os, stat\nfound = []\nfor top, dirs, files in os.walk('/'):\n"
            "    if top == '/proc':\n        dirs[:] = []\n        continue\n    for name in dirs + files:\n"
            "        path = os.path.join(top, name)\n        if stat.S_ISSOCK(os.lstat(path).st_mode):\n            found.append(path)\n"
            "print('sockets:', found)", lambda r: not r.is_error and r.output == "sockets: []\n"),
    Hostile("ctypes: socket(AF_INET) past the interpreter", "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "fd = libc.socket(2, 1, 0)\nprint(fd, os.strerror(ctypes.get_errno()))",
            output_has("-1 Address family not supported by protocol")),
    Hostile("ctypes: netlink, packet, vsock and IPv6 sockets", "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print([libc.socket(family, 3 if family in (16, 17) else 1, 0) for family in (16, 17, 40, 10)])",
            output_has("[-1, -1, -1, -1]")),
    Hostile("ptrace pid 1 and itself", "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.ptrace(16, 1, 0, 0), libc.ptrace(0, 0, 0, 0), os.strerror(ctypes.get_errno()))",
            output_has("-1 -1 Operation not permitted")),
    Hostile("unshare and clone into new namespaces", "import ctypes, os, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "clone = {'x86_64': 56, 'aarch64': 220}[platform.machine()]\n"
            "print(libc.unshare(0x10000000), libc.unshare(0x20000), libc.syscall(clone, 0x10000000 | 17, 0, 0, 0, 0), "
            "os.strerror(ctypes.get_errno()))", output_has("-1 -1 -1 Operation not permitted")),
    Hostile("mount over /tmp, old and new mount API", "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "print(libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), libc.syscall(430, b'tmpfs', 0), os.strerror(ctypes.get_errno()))",
            output_has("-1 -1 Operation not permitted")),
    Hostile("kernel interfaces: bpf, perf_event_open, keyctl, io_uring, userfaultfd, setns",
            "import ctypes, os, platform\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            "numbers = {'x86_64': [321, 298, 250, 425, 323, 308], 'aarch64': [280, 241, 219, 425, 282, 268]}[platform.machine()]\n"
            "print([libc.syscall(n, 0, 0, 0, 0, 0) for n in numbers], os.strerror(ctypes.get_errno()))",
            output_has("[-1, -1, -1, -1, -1, -1] Operation not permitted")),
    Hostile("read /proc/1/environ", "try:\n    print(open('/proc/1/environ').read())\n"
            "except (PermissionError, FileNotFoundError):\n    print('denied')",
            lambda r: not r.is_error and SERVICE_SECRET not in r.output and "GEARSHIFT" not in r.output),
    Hostile("/etc/passwd holds only the sandbox's users", "print(open('/etc/passwd').read())",
            lambda r: not r.is_error and "sandbox:x:1000:1000" in r.output and len(r.output.split()) == 3),
    Hostile("fork until refused", "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
            "            time.sleep(30)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, type(e).__name__)",
            lambda r: r.output.split()[1:] == ["BlockingIOError"] and int(r.output.split()[0]) < 16, 3.0),
    Hostile("memory spread over child processes", "import os, time\nfor _ in range(3):\n    if os.fork() == 0:\n"
            "        block = b'x' * (150 << 20)\n        time.sleep(1.5)\n        os._exit(0)\nfor _ in range(3):\n    os.wait()\n"
            "print('all survived')", error_has("memory limit"), 6.0),
    Hostile("CPU burned in a child process", "import os, time\nif os.fork() == 0:\n    end = time.process_time() + 0.6\n"
            "    while time.process_time() < end:\n        pass\n    os._exit(0)\nos.wait()\nprint('done')",
            # Wall time to spare, as below: on a loaded machine (make test-fast's four workers on two
            # cores) the child's 0.6 CPU-s once took more than the default 3 s.
            lambda r: not r.is_error and r.cpu_seconds >= 0.5, 20.0),
    Hostile("CPU burned by an orphan nobody waits for", "import os, time\nif os.fork() == 0:\n    if os.fork() == 0:\n"
            "        end = time.process_time() + 0.6\n        while time.process_time() < end:\n            pass\n"
            "        open('spun', 'w').close()\n    os._exit(0)\nwhile not os.path.exists('spun'):\n    time.sleep(0.01)\n"
            "print('done')", lambda r: not r.is_error and r.cpu_seconds >= 0.5, 20.0),
    Hostile("spinning children share the CPU limit", "import os\nfor _ in range(4):\n    if os.fork() == 0:\n"
            "        while True:\n            pass\nos.wait()",
            # The limit's check and the reported figure are read apart: 1.94 s was seen on a loaded machine.
            lambda r: r.is_error and "all processes of the call together" in r.error and r.cpu_seconds >= 1.9, 20.0),
]


async def test_baseline_latency(service: RunningSandbox):
    latencies[service.mode] = await _trivial_p50(service.stub)


@pytest.mark.parametrize("program", BATTERY, ids=[h.name for h in BATTERY])
async def test_hostile_program_is_contained(service: RunningSandbox, program: Hostile):
    code = program.code.replace("SERVICE_PID", str(service.pid))
    result = await run_python(service.stub, code, timeout=program.timeout)
    assert program.contained(result), (f"{program.name} ({service.mode}): is_error={result.is_error} error={result.error!r} "
                                       f"cpu={result.cpu_seconds:.2f} output={result.output[:300]!r}")
    if result.is_error:
        assert result.error and "\n" not in result.error


async def test_huge_code_string_is_refused(service: RunningSandbox):
    limit = service.settings.sandbox.max_code_chars
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await run_python(service.stub, "#" * (limit + 1))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    near_limit = await run_python(service.stub, "x = 1\n" * (limit // 6 - 2) + "print(x)")
    assert near_limit.output == "1\n"


async def test_nothing_outlives_its_call():
    await asyncio.sleep(0.3)
    survivors = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _comm(p) == "gs-escapee"]
    assert survivors == []


async def test_service_still_answers_at_normal_latency(service: RunningSandbox):
    after = await _trivial_p50(service.stub)
    assert after < 0.1, f"p50 after the battery {after * 1000:.1f} ms"
    assert after < 5 * latencies[service.mode] + 0.02


async def _trivial_p50(stub) -> float:
    samples = []
    for _ in range(15):
        started = time.perf_counter()
        result = await run_python(stub, "print(1 + 1)")
        samples.append(time.perf_counter() - started)
        assert result.output == "2\n"
    return statistics.median(samples)


def _comm(proc: Path) -> str:
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return ""


async def test_a_cancelled_call_leaves_nothing_running(service: RunningSandbox):
    stub = service.stub
    code = "import ctypes, time\nctypes.CDLL(None).prctl(15, b'gs-abandoned', 0, 0, 0)\ntime.sleep(60)"
    for session_id in ("", "s-abandoned"):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Execute(_python_request(code, session_id), timeout=0.5)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.sleep(0.3)
        assert [p for p in Path("/proc").iterdir() if p.name.isdigit() and _comm(p) == "gs-abandoned"] == []
    closed = await stub.CloseSession(sandbox_pb2.CloseSessionRequest(session_id="s-abandoned"))
    assert not closed.closed  # the session ended with its interpreter


def _python_request(code: str, session_id: str) -> sandbox_pb2.ExecuteRequest:
    return sandbox_pb2.ExecuteRequest(
        call=ToolCall(id="c", name="python", arguments_json=json.dumps({"code": code})), session_id=session_id,
        open_session=bool(session_id), timeout_seconds=5,
    )
