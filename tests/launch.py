"""Run code under ``accelerate launch`` with several CPU processes."""

from __future__ import annotations

import os
import socket
import sys


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_launch(num_processes: int) -> tuple[list[str], dict]:
    """The command prefix and environment for ``num_processes`` gloo ranks on the CPU.

    ``accelerate launch --cpu --num_processes N`` starts one process unless mpirun is set up; the
    torch.distributed launcher (``--multi_gpu``) with ``ACCELERATE_USE_CPU=1`` gives N ranks.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "1"}
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        str(num_processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
    ]
    return command, env
