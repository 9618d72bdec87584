"""Per-call memory and pids cgroups, where this process may create them (cgroup v1, as the
development machine has; without them rlimits and the service's watchdog stand in).

The zygote creates one directory per controller below its own cgroup
(`<own>/gearshift-sandbox-<service pid>-<serial>`); each worker, while still root, creates its own
directory below that, sets the limits and moves itself in, so everything the call starts is
counted together. The service reads the OOM-kill count after each call and removes a worker's
directories once its processes are gone.
"""

from __future__ import annotations

import contextlib
import os
import time

ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("memory", "pids")
PREFIX = "gearshift-sandbox-"


def _own_paths() -> dict[str, str]:
    """Controller -> this process's cgroup path, from /proc/self/cgroup (v1 lines)."""
    paths = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _id, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(","):
                if controller:
                    paths[controller] = path
    return paths


def prepare(tag: str) -> dict[str, str]:
    """Creates the parent directory of the workers' cgroups in each controller; {} when the
    hierarchy is not cgroup v1 or not writable here."""
    own = _own_paths()
    bases = {}
    for controller in CONTROLLERS:
        mount = f"{ROOT}/{controller}"
        if controller not in own or not os.path.exists(f"{mount}/cgroup.procs"):
            return {}
        parent = os.path.normpath(mount + own[controller])
        _sweep_stale(parent)
        base = f"{parent}/{PREFIX}{tag}"
        try:
            os.makedirs(base, exist_ok=True)
        except OSError:
            remove(list(bases.values()))
            return {}
        if not os.access(f"{base}/cgroup.procs", os.W_OK):
            return {}
        bases[controller] = base
    return bases


def _sweep_stale(parent: str) -> None:
    """Removes empty leftovers of services that died (their pid no longer runs)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            pid = name[len(PREFIX):].split("-")[0]  # gearshift-sandbox-<service pid>-<zygote serial>
            if name.startswith(PREFIX) and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
                remove_all([f"{parent}/{name}"], seconds=0)


def remove_all(bases: list[str], seconds: float) -> bool:
    """Removes these directories and every cgroup below them, retrying while processes in them
    are still exiting (the zygote's death takes its workers with it, a moment later)."""
    deadline = time.monotonic() + seconds
    while True:
        children = [f"{base}/{name}" for base in bases if os.path.isdir(base) for name in os.listdir(base)
                    if os.path.isdir(f"{base}/{name}")]
        if remove(children) and remove(bases):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def join_new(bases: dict[str, str], name: str, memory_bytes: int, max_pids: int) -> None:
    """Creates this worker's cgroups with their limits and moves the calling process in."""
    for controller, base in bases.items():
        path = f"{base}/{name}"
        os.mkdir(path)
        if controller == "memory":
            _write(f"{path}/memory.limit_in_bytes", memory_bytes)
            with contextlib.suppress(OSError):  # absent without swap accounting
                _write(f"{path}/memory.memsw.limit_in_bytes", memory_bytes)
        else:
            _write(f"{path}/pids.max", max_pids)
        _write(f"{path}/cgroup.procs", 0)  # 0: the writing process


def _write(path: str, value: int) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def oom_kills(memory_dir: str) -> int:
    """Processes the kernel killed in this memory cgroup for exceeding its limit."""
    try:
        with open(f"{memory_dir}/memory.oom_control") as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except OSError:
        pass
    return 0


def remove(dirs: list[str]) -> bool:
    """Removes cgroup directories; False while one still holds processes."""
    done = True
    for path in dirs:
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        except OSError:
            done = False
    return done
