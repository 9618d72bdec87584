"""Isolated python workers, service side: the zygote that forks them, one worker's call
protocol (code in, capped output and a result out, a hard kill on any limit), and the warm pool.

The worker runtime itself lives in zygote.py (standard library only, started with `-I -S`).
The service measures each call itself (usage.py) and enforces the limits that span all of a
call's processes: CPU seconds always, memory where no cgroup holds it; per-process rlimits and,
where writable, per-call cgroups (isolation/cgroups.py) act inside the kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import secrets
import select
import shutil
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from gearshift.services.sandbox.isolation import cgroups
from gearshift.services.sandbox.usage import tree_usage

log = logging.getLogger("gearshift.sandbox.workers")

ZYGOTE_SCRIPT = Path(__file__).with_name("zygote.py")
ZYGOTE_START_TIMEOUT_SECONDS = 60.0  # finding the shared libraries loads every extension module once
SPAWN_TIMEOUT_SECONDS = 10.0
DRAIN_AFTER_KILL_SECONDS = 0.3
WATCH_SECONDS = 0.1  # how often a running call's processes are measured against its limits
CGROUP_REMOVAL_SECONDS = 5.0
MB = 1024 * 1024
TRUNCATION_MARKER = "\n[... output truncated after {limit} characters ...]"
_zygote_serial = itertools.count()
_worker_serial = itertools.count()
_cleanups: set[asyncio.Task] = set()


class SpawnError(RuntimeError):
    """A worker could not be started or isolated."""


@dataclass
class WorkerLimits:
    """Per-worker limits sent to the zygote with each spawn request."""

    cpu_seconds: int
    memory_mb: int
    file_mb: int
    max_processes: int
    max_open_files: int
    tmp_mb: int
    tmp_inodes: int

    def spec(self, uid: int) -> dict:
        return {**self.__dict__, "uid": uid}


@dataclass
class RunOutcome:
    """What one code run produced."""

    ok: bool
    error: str
    output: str
    truncated: bool
    cpu_seconds: float
    alive: bool  # the worker survived and can take another call (sessions)


class UidAllocator:
    """Hands out uids from a range, round robin, skipping those still held by live workers,
    so that no two live workers share a uid (uids separate signals, ptrace and RLIMIT_NPROC)."""

    def __init__(self, base: int, count: int):
        self.base, self.count = base, count
        self._next = 0
        self._held: set[int] = set()

    def take(self) -> int:
        for _ in range(self.count):
            uid = self.base + self._next
            self._next = (self._next + 1) % self.count
            if uid not in self._held:
                self._held.add(uid)
                return uid
        raise SpawnError("no free sandbox uid: too many live workers")

    def release(self, uid: int) -> None:
        self._held.discard(uid)


@dataclass
class _Collected:
    """A call's output as read so far (filled in place, so a cancelled read keeps its part)."""

    kept: bytearray = field(default_factory=bytearray)
    total: int = 0
    marked: bool = False
    overflow: bool = False
    ended: bool = False


async def _collect(reader: asyncio.StreamReader, marker: bytes, keep_bytes: int, stop_bytes: int, into: _Collected) -> None:
    """Reads a call's output until its end marker, keeping the first keep_bytes."""
    window = b""
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            payload, window = window, b""
        else:
            window += chunk
            cut = window.find(marker)
            if cut >= 0:
                payload, window, into.marked = window[:cut], b"", True
            else:  # hold back what may be the start of the marker
                safe = max(0, len(window) - len(marker) + 1)
                payload, window = window[:safe], window[safe:]
        into.total += len(payload)
        into.kept += payload[: max(0, keep_bytes - len(into.kept))]
        if not chunk or into.marked:
            into.ended = True
            return
        if into.total > stop_bytes:
            into.overflow = into.ended = True
            return


def _remove_cgroups_later(dirs: list[str]) -> None:
    """Removes a dead worker's cgroups once the kernel has let its last process go. In a thread:
    rmdir waits for the cgroup lock, which a worker joining its cgroups elsewhere may hold for a
    while, and the event loop must not wait with it."""
    if not dirs:
        return

    async def retry() -> None:
        deadline = time.monotonic() + CGROUP_REMOVAL_SECONDS
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if await asyncio.to_thread(cgroups.remove, dirs):
                return
        log.warning("sandbox cgroups still busy, left in place: %s", ", ".join(dirs))

    task = asyncio.get_running_loop().create_task(retry())
    _cleanups.add(task)
    task.add_done_callback(_cleanups.discard)


@dataclass
class Worker:
    """One isolated interpreter waiting for code."""

    pid: int
    pidfd: int
    uid: int
    workdir: str
    isolated: bool  # its own namespaces (killing pid 1 kills everything) and root (no host cleanup)
    limits: WorkerLimits
    control: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    output: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    cgroup_dirs: list[str] = field(default_factory=list)
    memory_cgroup: str = ""
    on_exit: list = field(default_factory=list)
    dead: bool = False
    _cpu_seen: float = 0.0
    _oom_seen: int = 0

    async def run(self, code: str, timeout: float, max_output_chars: int, keep: bool) -> RunOutcome:
        """Runs code; kills the worker on any limit, and after the call unless keep is set."""
        reader, writer = self.control
        marker = f"\x00gearshift-end-{secrets.token_hex(12)}\x00"
        keep_bytes = max_output_chars * 4
        stop_bytes = keep_bytes * 8
        cpu_before = self._cpu_now()
        writer.write(json.dumps({"code": code, "marker": marker, "keep": keep}).encode() + b"\n")
        try:
            await writer.drain()
        except (ConnectionError, OSError):
            self.kill()
            return RunOutcome(False, "sandbox worker was not running", "", False, 0.0, alive=False)

        collected = _Collected()
        collecting = asyncio.create_task(_collect(self.output[0], marker.encode(), keep_bytes, stop_bytes, collected))
        answering = asyncio.create_task(reader.readline())
        try:
            limit_error, result = await self._await_result(collecting, answering, collected, timeout, stop_bytes)
        except BaseException:  # the caller went away (RPC cancelled): nothing may keep running
            collecting.cancel()
            self.kill()
            raise
        cpu = self._cpu_now() - cpu_before
        oom_kills = self._new_oom_kills()

        error = limit_error
        if not error and oom_kills:
            error = f"memory limit of {self.limits.memory_mb} MB exceeded: {oom_kills} process(es) of the call killed"
        if not error and result is None:
            error = "the process died without a result (memory, process or file limit, or a crash)"
        fatal = bool(error) or result is None or result.get("fatal") or not result.get("marked")
        if not error and not result.get("ok"):
            error = str(result.get("error") or "the code failed")
        alive = keep and not fatal
        if not alive:
            self.kill()
        # The rest of the output is buffered already (marker seen) or ends with the process.
        with contextlib.suppress(TimeoutError):
            # asyncio.timeout, unlike wait_for in 3.11, never swallows a cancellation
            async with asyncio.timeout(2.0 if not fatal else DRAIN_AFTER_KILL_SECONDS):
                await collecting

        output = collected.kept.decode("utf-8", errors="replace")
        truncated = collected.overflow or collected.total > len(collected.kept) or len(output) > max_output_chars
        if truncated:
            output = output[:max_output_chars] + TRUNCATION_MARKER.format(limit=max_output_chars)
        return RunOutcome(not error, error, output, truncated, cpu, alive=alive)

    @property
    def exited(self) -> bool:
        """Whether its process is gone (killed here, or dead with its zygote)."""
        return self.dead or bool(select.select([self.pidfd], [], [], 0)[0])

    def _cpu_now(self) -> float:
        """CPU seconds of everything this worker ran so far (the last figure seen, once it is gone)."""
        self._cpu_seen = max(self._cpu_seen, tree_usage(self.pid).cpu_seconds)
        return self._cpu_seen

    def _new_oom_kills(self) -> int:
        if not self.memory_cgroup:
            return 0
        total = cgroups.oom_kills(self.memory_cgroup)
        new, self._oom_seen = total - self._oom_seen, total
        return new

    def _over_limit(self) -> str:
        """The limit a running call's processes together exceed, if any."""
        usage = tree_usage(self.pid, memory=not self.memory_cgroup)
        self._cpu_seen = max(self._cpu_seen, usage.cpu_seconds)
        if usage.cpu_seconds > self.limits.cpu_seconds:
            return f"CPU time limit exceeded ({self.limits.cpu_seconds} s, all processes of the call together)"
        if usage.memory_bytes > self.limits.memory_mb * MB:
            return f"memory limit exceeded ({self.limits.memory_mb} MB, all processes of the call together)"
        return ""

    async def _await_result(self, collecting, answering, collected: _Collected, timeout: float, stop_bytes: int):
        """Waits for the worker's result line; returns (limit error or "", parsed result or None)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        pending = {collecting, answering}
        error = ""
        try:
            while answering in pending:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    error = f"timed out after {timeout:g} s"
                    break
                done, pending = await asyncio.wait(pending, timeout=min(remaining, WATCH_SECONDS),
                                                   return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    error = self._over_limit()
                    if error:
                        break
                    continue
                if collecting in done and collected.overflow:
                    error = f"output exceeded {stop_bytes} bytes; process stopped"
                    break
                if collecting in done and not collected.marked and answering in pending:
                    # Output closed without the marker: the process is ending; allow its last word.
                    await asyncio.wait({answering}, timeout=DRAIN_AFTER_KILL_SECONDS)
                    break
        finally:
            if not answering.done():
                answering.cancel()
        result = None
        if not error and answering.done() and not answering.cancelled():
            with contextlib.suppress(ValueError):
                result = json.loads(answering.result() or b"null")
            if not isinstance(result, dict):
                result = None
        return error, result

    def kill(self) -> None:
        """Kills the worker and, through its pid namespace, everything it started."""
        if self.dead:
            return
        self.dead = True
        if self.pidfd >= 0:
            with contextlib.suppress(ProcessLookupError, OSError):
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        if not self.isolated and self.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)  # its session's group; escapees need the pid namespace
        if self.pidfd >= 0:
            os.close(self.pidfd)
        for _reader, writer in (self.control, self.output):
            writer.close()
        if not self.isolated and self.workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)
        _remove_cgroups_later(self.cgroup_dirs)
        for callback in self.on_exit:
            callback(self)


class Zygote:
    """The pre-started, clean interpreter that forks isolated workers on request."""

    def __init__(self, config: dict, uids: UidAllocator, probe_limits: WorkerLimits):
        self.config = config
        self.uids = uids
        self.probe_limits = probe_limits
        self.isolation: dict = {}
        self.cgroup_bases: dict[str, str] = {}
        self._process: asyncio.subprocess.Process | None = None
        self._socket: socket.socket | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> dict:
        """Starts the zygote and returns its isolation report (what holds here, and why not)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        probe_uid = self.uids.take()
        config = {
            **self.config, "control_fd": theirs.fileno(), "service_pid": os.getpid(),
            "cgroup_tag": f"{os.getpid()}-{next(_zygote_serial)}", "probe": self.probe_limits.spec(probe_uid),
        }
        try:
            self._process = await asyncio.create_subprocess_exec(
                # The real interpreter, not a virtual environment's link to it: workers run it too.
                os.path.realpath(sys.executable), "-I", "-S", str(ZYGOTE_SCRIPT), json.dumps(config),
                pass_fds=[theirs.fileno()], env={"LANG": "C.UTF-8"}, cwd="/",
                start_new_session=True,  # a terminal's Ctrl-C is for the service, which stops the zygote itself
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            )
            theirs.close()
            ours.setblocking(False)
            self._socket = ours
            async with asyncio.timeout(ZYGOTE_START_TIMEOUT_SECONDS):
                hello = await asyncio.get_running_loop().sock_recv(ours, 1 << 20)
        finally:
            self.uids.release(probe_uid)
        if not hello:
            raise SpawnError("the sandbox zygote exited at start")
        message = json.loads(hello)
        self.isolation, self.cgroup_bases = message["isolation"], message["cgroups"]
        return self.isolation

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    async def spawn(self, limits: WorkerLimits) -> Worker:
        """Forks one worker, waits until it is isolated, and returns it (restarting a dead zygote)."""
        if not self.running:
            async with self._lock:
                if not self.running:
                    log.warning("the sandbox zygote exited (code %s); restarting it", self._process and self._process.returncode)
                    await self.stop()
                    await self.start()
        uid = self.uids.take()
        try:
            return await self._spawn(limits, uid)
        except BaseException:
            self.uids.release(uid)
            raise

    async def _spawn(self, limits: WorkerLimits, uid: int) -> Worker:
        control, control_child = socket.socketpair()
        output, output_child = socket.socketpair()
        cgroup = f"w{next(_worker_serial)}"
        try:
            async with self._lock:
                self._send_spawn({**limits.spec(uid), "cgroup": cgroup}, [control_child.fileno(), output_child.fileno()])
        finally:
            control_child.close()
            output_child.close()
        control_streams = await asyncio.open_unix_connection(sock=control)
        output_streams = await asyncio.open_unix_connection(sock=output)
        joined = bool(self.cgroup_bases) and (self.isolation.get("isolated") or os.geteuid() == 0)
        worker = Worker(
            0, -1, uid, "", bool(self.isolation.get("isolated")), limits, control_streams, output_streams,
            cgroup_dirs=[f"{base}/{cgroup}" for base in self.cgroup_bases.values()] if joined else [],
            memory_cgroup=f"{self.cgroup_bases['memory']}/{cgroup}" if joined else "",
            on_exit=[lambda w: self.uids.release(w.uid)],
        )
        try:
            # Two messages in either order: the pid (from the process outside the new pid
            # namespace) and ready or failed (from the isolated process itself).
            ready = False
            while not ready or worker.pidfd < 0:
                message = await self._read_message(control_streams[0])
                if "failed" in message:
                    raise SpawnError(f"worker isolation failed: {message['failed']}")
                if "pid" in message:
                    worker.pid, worker.pidfd = message["pid"], os.pidfd_open(message["pid"])
                if message.get("ready"):
                    ready, worker.workdir = True, message["workdir"]
        except BaseException:
            worker.kill()
            raise
        return worker

    def _send_spawn(self, spec: dict, fds: list[int]) -> None:
        if not self.running or self._socket is None:
            raise SpawnError("the sandbox zygote is not running")
        try:
            socket.send_fds(self._socket, [json.dumps(spec).encode()], fds)
        except OSError as exc:
            raise SpawnError(f"the sandbox zygote does not answer: {exc}") from exc

    @staticmethod
    async def _read_message(reader: asyncio.StreamReader) -> dict:
        async with asyncio.timeout(SPAWN_TIMEOUT_SECONDS):
            line = await reader.readline()
        if not line:
            raise SpawnError("worker exited while starting")
        return json.loads(line)

    async def stop(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._process is not None and self._process.returncode is None:
            self._process.kill()
            await self._process.wait()
        if self.cgroup_bases:  # with every worker's cgroup, also those of workers never handed over
            await asyncio.gather(*_cleanups, return_exceptions=True)
            bases, self.cgroup_bases = list(self.cgroup_bases.values()), {}
            if not await asyncio.to_thread(cgroups.remove_all, bases, CGROUP_REMOVAL_SECONDS):
                log.warning("sandbox cgroups still busy, left in place: %s", ", ".join(bases))


class WarmPool:
    """Keeps a few isolated one-shot workers ready; each serves one call and is discarded.

    Building a worker costs milliseconds of CPU, which on a small machine would compete with the
    call that just took one; so while the pool is at least half full the next worker is built
    once no call is running, and at once only when the pool runs low."""

    def __init__(self, zygote: Zygote, limits: WorkerLimits, size: int):
        self.zygote = zygote
        self.limits = limits
        self.size = size
        self._ready: asyncio.Queue[Worker] = asyncio.Queue(maxsize=max(size, 1))
        self._filler: asyncio.Task | None = None
        self._calls = 0
        self._quiet = asyncio.Event()
        self._quiet.set()
        self._closed = False

    def start(self) -> None:
        if self.size > 0:
            self._filler = asyncio.create_task(self._fill())

    @property
    def warm(self) -> int:
        return self._ready.qsize()

    async def _fill(self) -> None:
        while not self._closed:
            if self._ready.qsize() >= max(1, self.size // 2):
                await self._quiet.wait()
            try:
                worker = await self.zygote.spawn(self.limits)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("could not pre-start a sandbox worker; retrying")
                await asyncio.sleep(1.0)
                continue
            if self._closed:  # closed while this worker was being built
                worker.kill()
                return
            await self._ready.put(worker)

    @contextlib.asynccontextmanager
    async def worker(self) -> AsyncIterator[Worker]:
        """A warm worker for one call (a freshly built one when none is ready)."""
        self._calls += 1
        self._quiet.clear()
        try:
            yield await self._take()
        finally:
            self._calls -= 1
            if not self._calls:
                self._quiet.set()

    async def _take(self) -> Worker:
        while not self._ready.empty():
            worker = self._ready.get_nowait()
            if not worker.exited:
                return worker
            worker.kill()
        started = time.perf_counter()
        worker = await self.zygote.spawn(self.limits)
        log.debug("pool empty: spawned a worker in %.1f ms", 1000 * (time.perf_counter() - started))
        return worker

    async def close(self) -> None:
        self._closed = True
        if self._filler is not None:
            self._filler.cancel()
            await asyncio.wait({self._filler}, timeout=SPAWN_TIMEOUT_SECONDS)
        for _ in range(2):  # a filler stuck on a full queue puts one last worker once it drains
            while not self._ready.empty():
                self._ready.get_nowait().kill()
            if self._filler is not None:
                await asyncio.wait({self._filler}, timeout=1.0)
