"""Executors sharing one spool volume (the chart's executor.spool.persistence, a ReadWriteMany
claim): each live executor spools into a directory of its own under the volume's root, held by an
exclusive lock (flock) for the life of its process, and takes over the directories of executors
that are gone (their lock free), so a pod deleted while the store was down leaves its acknowledged
trajectories for the next executor to replay instead of taking them with it.

On one executor's own volume (an emptyDir, the default) the same code covers a restarted
container: its directory is free again, and it replays what it left there."""

from __future__ import annotations

import asyncio
import fcntl
import itertools
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

from gearshift.services.executor.spool import Spool

log = logging.getLogger("gearshift.executor")

LOCK_FILE = ".owner"
ADOPT_INTERVAL_SECONDS = 30.0  # how often a live executor looks for directories left by executors that are gone


def replica_name() -> str:
    """This executor's name among those sharing the volume: its pod's (the hostname)."""
    return os.environ.get("HOSTNAME") or socket.gethostname()


def claim(root: Path, name: str) -> Spool:
    """This process's spool under root: the directory `name`, or name-1, name-2, ... where a live
    process holds it (several executors on one host)."""
    root.mkdir(parents=True, exist_ok=True)
    for index in itertools.count():
        directory = root / (name if index == 0 else f"{name}-{index}")
        lock = _lock(directory)
        if lock is not None:
            return Spool(directory, lock)


async def adopt_orphans(spool: Spool, root: Path) -> int:
    """Moves into spool the entries of every directory under root whose executor is gone;
    returns how many. A directory left empty is removed (one holding refused/ stays for an
    operator)."""
    adopted = 0
    for directory in sorted(path for path in root.iterdir() if path.is_dir() and path != spool.directory):
        lock = _lock(directory)
        if lock is None:  # its executor lives
            continue
        try:
            moved = await spool.adopt(directory)
            if moved:
                log.warning("took over %d spooled trajectories from %s, whose executor is gone", moved, directory)
            adopted += moved
            if [path.name for path in directory.iterdir()] == [LOCK_FILE]:
                (directory / LOCK_FILE).unlink()
                directory.rmdir()
        finally:
            os.close(lock)
    return adopted


async def keep_adopting(spool: Spool, root: Path, adopted: Callable[[], None], interval: float = ADOPT_INTERVAL_SECONDS) -> None:
    """Adopts orphans now and every interval; calls adopted() after a take-over (the replay wakes)."""
    while True:
        try:
            if await adopt_orphans(spool, root):
                adopted()
        except OSError as error:  # a volume briefly away: the next round tries again
            log.warning("looking for spools of executors that are gone under %s failed: %s", root, error)
        await asyncio.sleep(interval)


def _lock(directory: Path) -> int | None:
    """An open descriptor holding directory's lock, or None when another process holds it."""
    directory.mkdir(exist_ok=True)
    descriptor = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    return descriptor
