"""Executors sharing one spool volume (services/executor/spool_volume.py), as real processes: a
directory each, locked while its executor lives; the trajectories of one killed with -9 are
taken over by a live one, in their order, and a live one's are left alone."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from gearshift.services.executor import spool_volume

from tests.libs.storage.helpers import make_trajectory

ROOT = Path(__file__).parents[3]

# An executor's spool: claims its directory under the root, spools three trajectories, prints their
# ids and waits to be killed.
SPOOLING = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from gearshift.services.executor import spool_volume
    from tests.libs.storage.helpers import make_trajectory

    async def main():
        spool = spool_volume.claim(Path(sys.argv[1]), "executor-a")
        written = [make_trajectory() for _ in range(3)]
        for trajectory in written:
            await spool.append(trajectory)
        print(spool.directory.name, *(t.id for t in written), flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


def spooling_executor(root: Path) -> tuple[subprocess.Popen, str, list[str]]:
    process = subprocess.Popen([sys.executable, "-c", SPOOLING, str(root)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    directory, *ids = process.stdout.readline().split()
    return process, directory, ids


async def test_a_killed_executors_spool_is_taken_over_in_order_and_a_live_ones_is_not(tmp_path):
    dead, dead_directory, dead_ids = spooling_executor(tmp_path)
    alive, alive_directory, alive_ids = spooling_executor(tmp_path)
    try:
        assert (dead_directory, alive_directory) == ("executor-a", "executor-a-1")  # one host: a directory each
        dead.send_signal(signal.SIGKILL)
        dead.wait()

        spool = spool_volume.claim(tmp_path, "executor-b")
        await spool.append(own := make_trajectory())
        assert await spool_volume.adopt_orphans(spool, tmp_path) == 3
        assert [entry.trajectory_id for entry in spool.oldest(10)] == [own.id, *dead_ids]
        assert [(await spool.trajectory(i)).id for i in dead_ids] == dead_ids
        assert not (tmp_path / dead_directory).exists()  # emptied and removed
        assert len(list((tmp_path / alive_directory).glob("*.trajectory"))) == 3  # its executor lives: left alone
        assert await spool_volume.adopt_orphans(spool, tmp_path) == 0
    finally:
        alive.kill()
        alive.wait()
    assert await spool_volume.adopt_orphans(spool, tmp_path) == 3
    await spool.close()


async def test_a_directory_is_free_again_once_its_executor_closes_its_spool(tmp_path):
    first = spool_volume.claim(tmp_path, "executor")
    second = spool_volume.claim(tmp_path, "executor")
    assert (first.directory.name, second.directory.name) == ("executor", "executor-1")
    await first.append(left := make_trajectory())
    await first.close()
    again = spool_volume.claim(tmp_path, "executor")  # a restarted container: its own directory, what it left in it
    assert again.directory == first.directory and [entry.trajectory_id for entry in again.oldest(5)] == [left.id]
    await second.close()
    await again.close()
