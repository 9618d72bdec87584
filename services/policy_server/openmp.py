"""How torch's idle OpenMP thread waits between kernels (the package sets it on import).

Sleeping is the default: when another process holds one of the cores, a spinning thread burns the
other while the kernel waits for its partner (a decode step took 0.9-1.5 s spinning, 0.17-0.29 s
sleeping, on two shared cores). Waking it costs a little on every kernel, though, and a server
that has its cores to itself does better spinning briefly (docs/policy-server.md has the figures).
"""

import os

SPIN_COUNT = "20000"  # about 0.25 ms on this CPU: the gap between two kernels of a step, not between steps


def set_wait_policy(spin: bool) -> None:
    """Sets libgomp's wait policy unless the environment already chose one."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    if spin:
        os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
    else:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
