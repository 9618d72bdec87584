"""How torch's idle OpenMP thread waits between kernels (the package sets it on import, before
torch loads: this module must not import torch).

Spinning about 0.25 ms is the default (`spin_wait`): waking a sleeping thread costs tens to
hundreds of microseconds per kernel, much of a small model's step (an 8-row SmolLM2 step took
70 ms spinning, 97 ms sleeping, on two idle cores). Spinning costs only when another process holds
one of the cores, and thread_tuner.py drops to one thread then.
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


def spinning() -> bool:
    """Whether libgomp, as this process loaded it, spins between kernels."""
    return os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE" and os.environ.get("GOMP_SPINCOUNT") != "0"
