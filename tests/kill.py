"""Kill running ``bytedistill dump`` processes midway, as a crash would: SIGKILL once their output
holds some finished shards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPOSITORY = str(Path(__file__).resolve().parent.parent)


def start_bytedistill(argv: Sequence[str], stderr=subprocess.DEVNULL) -> subprocess.Popen:
    """``python -m bytedistill ARGV`` in its own process (this checkout first on its path), its
    standard output discarded, its standard error too unless ``stderr`` says otherwise."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPOSITORY, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "bytedistill", *map(str, argv)],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env=env,
    )


def kill_after_shards(procs: Sequence[subprocess.Popen], output: Path, shards: int, timeout: float = 900) -> int:
    """SIGKILL every process of ``procs`` once ``output`` holds ``shards`` finished shards
    (``shard-*.bds``); returns the finished shards left behind. Asserts that none of them had
    ended by then: the kill came mid-run.

    The processes run in slices of 20 ms and are stopped (SIGSTOP) while the shards are counted
    and when they are killed, so however fast a dump is, it cannot finish between the count and
    the kill. ``timeout`` only bounds a dump that never writes the shards."""
    deadline = time.monotonic() + timeout
    while True:
        _signal(procs, signal.SIGSTOP)
        ended = any(proc.poll() is not None for proc in procs)
        if ended or len(list(output.glob("shard-*.bds"))) >= shards or time.monotonic() > deadline:
            break
        _signal(procs, signal.SIGCONT)
        time.sleep(0.02)
    assert all(proc.poll() is None for proc in procs), "a dump finished before it could be killed"
    _signal(procs, signal.SIGKILL)
    for proc in procs:
        proc.wait()
    return len(list(output.glob("shard-*.bds")))


def _signal(procs: Sequence[subprocess.Popen], signum: int) -> None:
    for proc in procs:
        proc.send_signal(signum)
