"""How many intra-op threads torch uses on the CPU (every ``bytedistill`` command).

torch's default is one thread per core. On a machine that other jobs also keep busy, its threads
wait for each other at the end of every parallel operation, and a thread the kernel has parked
stalls them all: training ran 11× slower with the default than idle, and 2.6× faster with one
thread under the same load. So the default is the CPUs this process may run on (its affinity
mask) less the other tasks the kernel is running right now (``/proc/loadavg``), at least 1;
``OMP_NUM_THREADS`` (or ``TORCH_NUM_THREADS``) set in the environment wins over that default, and a
command's own ``--threads`` (``dump``) over both. The router sets them once, before the command
runs; after that only a dump resuming a store written on a CPU changes them, to the count the store
was written with when its user chose none (``distill/dump/numerics.py``).
"""

from __future__ import annotations

import os
import time

ENVIRONMENT = ("TORCH_NUM_THREADS", "OMP_NUM_THREADS")
HELP = (
    "torch CPU threads: OMP_NUM_THREADS=N in the environment; by default the CPUs this process may use, "
    "less one for each other task running at the start (at least 1)"
)


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def other_running_tasks(samples: int = 5, interval: float = 0.01) -> int:
    """Runnable tasks other than this one, the median of a few reads of ``/proc/loadavg`` (0 if unreadable)."""
    counts = []
    for _ in range(samples):
        try:
            with open("/proc/loadavg", encoding="ascii") as f:
                running = int(f.read().split()[3].split("/")[0])
        except (OSError, ValueError, IndexError):
            return 0
        counts.append(max(running - 1, 0))
        time.sleep(interval)
    return sorted(counts)[len(counts) // 2]


def environment_threads(environ=os.environ) -> tuple[int, str] | None:
    """The thread count the environment sets, and why (``None``: it sets none)."""
    for name in ENVIRONMENT:
        value = environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value), f"{name}={value}"
    return None


def threads_chosen(requested: int | None = None, environ=os.environ) -> bool:
    """Whether the thread count was chosen by the user (``--threads``, the environment), not by the load."""
    return bool(requested) or environment_threads(environ) is not None


def default_threads(environ=os.environ) -> tuple[int, str]:
    """The thread count and why."""
    if (chosen := environment_threads(environ)) is not None:
        return chosen
    cpus, busy = available_cpus(), other_running_tasks()
    return max(1, cpus - busy), f"{cpus} CPUs, {busy} other running tasks"


def set_threads(requested: int | None = None, environ=os.environ) -> tuple[int, str]:
    """Set torch's intra-op threads to ``requested`` if given, else :func:`default_threads`; returns
    them and why."""
    import torch

    threads, why = (requested, f"--threads {requested}") if requested else default_threads(environ)
    torch.set_num_threads(threads)
    return threads, why
