"""Run code under ``accelerate launch`` with several CPU processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_launch(
    num_processes: int, *, num_machines: int = 1, machine_rank: int = 0, port: int | None = None
) -> tuple[list[str], dict]:
    """The command prefix and environment for ``num_processes`` gloo ranks on the CPU.

    ``accelerate launch --cpu --num_processes N`` starts one process unless mpirun is set up; the
    torch.distributed launcher (``--multi_gpu``) with ``ACCELERATE_USE_CPU=1`` gives N ranks.
    With ``num_machines`` > 1 it is the launch of machine ``machine_rank`` (``num_processes`` is
    the total): run one per machine, all with the same ``port``; the main machine is 127.0.0.1.
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
        str(num_machines),
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(port or free_port()),
    ]
    if num_machines > 1:
        command += ["--machine_rank", str(machine_rank), "--main_process_ip", "127.0.0.1"]
    return command, env


def run_on_two_machines(args: list[str], cwd=None, timeout: int = 600) -> None:
    """``accelerate launch`` of ``args`` as two machines of one process each, on this host."""
    port = free_port()
    procs = []
    for rank in (0, 1):
        command, env = cpu_launch(2, num_machines=2, machine_rank=rank, port=port)
        procs.append(
            subprocess.Popen(
                command + args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    for rank, proc in enumerate(procs):
        _, err = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"machine {rank}: {err[-3000:]}"
