"""Our server beside llama.cpp's ``llama-server`` on the same student: one run, two tables.

The student is the serving benchmark's flat student of size S (``benchmarks/serve.py``; random
weights: speed depends on shapes) over the ``bytes`` stream, the tokenizer-free student (docs/DESIGN.md,
"The bytes stream"), ``<eos>`` suppressed so that every answer is whole. The benchmark writes its
exported folder (``students.release.export.write_export``) and that folder's GGUF
(``students.release.gguf_export.export_gguf``, f32), then starts both servers on 127.0.0.1, each
in a process of its own on the same threads (``--threads``, default 1): ``bytedistill serve`` of the
folder (32 slots, its step eager) and ``llama-server -m X.gguf -np 32 -t T`` (continuous batching
over 32 slots; ``ignore_eos`` asked for: answers as whole as ours). The official ``openai`` client
loads them as ``benchmarks/serve.py`` does (its load reused): 1, 8 and 32 concurrent clients, each
streaming answers of 256 bytes (``max_tokens`` counts bytes on both: the GGUF's tokens are bytes),
bytes counted from the usage each server reports. The sides alternate, round after round (the one
that goes first swaps each round), so that the ratios ours/llama-server are of runs a moment apart:
the median of each round's ratio. A load in which a server drops a connection (``llama-server``
did, now and then, at 32 clients) is run again and the count said in the table's line. Per side and count of clients: bytes/s in all and time to first
byte (p50, p99; the median over rounds), and ours at 32 clients over ours at 1 beside what decode
steps at the FLOPs-and-bytes bound would allow (the bound of ``benchmarks/serve.py``).

Then the step at batch 1: our engine's step (eager and compiled) in ms per byte beside
``llama-bench -m X.gguf -p 0 -n 128 -t T``'s token generation in ms per token (a token is a
byte). A line starting ``summary`` names each goal met or MISSED: ours ahead at 8 and 32 clients,
32 clients at least 8 times one client's bytes/s, our batch-1 step no slower than llama.cpp's.

The llama.cpp binaries are found in ``--llama-cpp-bin DIR`` (default: the environment's
``LLAMA_CPP_BIN``, else ``llama-server`` on the PATH); without them only our side runs, and the
summary says so (the README's section on GGUF has the build commands).

    python -m benchmarks.peers --llama-cpp-bin /work/llama.cpp-build/vendor/llama.cpp/build/bin [--markdown]
    python -m benchmarks.peers --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.generation import SIZES, SMOKE_SIZES, Shape, flat_student, matmul_rate, texts
from benchmarks.results import markdown_table, write_section
from benchmarks.serve import (
    CLIENTS,
    GOAL_SCALING,
    LoadRow,
    best_of,
    copy_rate,
    load,
    load_bound_bps,
    verdict,
    wait_ready,
)
from bytestream.stream_kind import StreamKind
from students.models.cost import StreamRates

BYTES = StreamKind.BYTES
BYTES_RATES = StreamRates(symbols_per_byte=1.0, patches_per_byte=0.0)  # one symbol a byte; no patches
OURS, THEIRS = "ours", "llama-server"
NOT_FOUND = "llama.cpp rows not run (no llama-server found)"
# what each side is asked beyond the load's own arguments: the usage (bytes) reported at the end; of
# llama-server, that it go on past <eos> as ours does (ours suppresses it)
REQUEST = {
    OURS: {"stream_options": {"include_usage": True}},
    THEIRS: {"stream_options": {"include_usage": True}, "extra_body": {"ignore_eos": True}},
}


# ------------------------------------------------------------------ the student, its folder and its GGUF


def bytes_student(size: Shape):
    """The serving benchmark's flat student of ``size`` over the ``bytes`` stream, ``<eos>``
    suppressed (in its generation config, so that the served folder keeps it)."""
    from students.release.export import generation_config

    model = flat_student(size, stream=BYTES)
    model.generation_config = generation_config(BYTES)
    model.generation_config.suppress_tokens = [BYTES.bos, BYTES.pad, BYTES.eos]
    return model


def write_student(model, work: Path) -> tuple[Path, Path]:
    """The exported folder of ``model`` and its f32 GGUF, under ``work``."""
    from students.release.export import write_export
    from students.release.gguf_export import export_gguf

    folder = work / "student"
    write_export(folder, model, "", {})
    return folder, export_gguf(folder, work / "student.f32.gguf", "f32")


# ------------------------------------------------------------------ the two servers


def llama_cpp_bin(given: str | None) -> Path | None:
    """The folder of ``llama-server`` (and ``llama-bench``): ``given``, else ``$LLAMA_CPP_BIN``, else
    the PATH's; None where there is none."""
    folder = given or os.environ.get("LLAMA_CPP_BIN")
    if folder:
        return Path(folder) if (Path(folder) / "llama-server").is_file() else None
    found = shutil.which("llama-server")
    return Path(found).parent if found else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Running:
    side: str
    url: str
    process: subprocess.Popen


def start_server(side: str, command: list[str], port: int, threads: int, log: Path, limit_s: float = 300) -> Running:
    """``command`` in a process of its own (its output to ``log``), once its /health answers 200."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH")]))
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        ready_s = wait_ready(url, limit_s, exited=lambda: process.poll() is not None)
    except (RuntimeError, TimeoutError) as error:
        process.kill()
        raise SystemExit(f"{side}: {error}: {log.read_text()[-2000:]}") from None
    print(f"{side} ready after {ready_s:.1f} s on {url}", flush=True)
    return Running(side, url, process)


def ours_command(folder: Path, port: int, slots: int) -> list[str]:
    return [sys.executable, "-m", "bytedistill", "serve", str(folder), "--port", str(port), "--slots", str(slots),
            "--max-queue", str(4 * slots), "--model-name", "student"]  # fmt: skip


def theirs_command(binaries: Path, gguf: Path, port: int, slots: int, threads: int, context: int) -> list[str]:
    return [str(binaries / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-t", str(threads), "-tb", str(threads), "-c", str(slots * context),
            "--no-webui"]  # fmt: skip


def stop(running: Running) -> None:
    running.process.terminate()
    try:
        running.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        running.process.kill()
        running.process.wait()


# ------------------------------------------------------------------ load, alternating


def load_rounds(
    args, servers: dict[str, Running], prompts: list[str], dropped: dict[str, int]
) -> dict[tuple[str, int], list[LoadRow]]:
    """(side, clients) -> a load row per round; in each round every count of clients loads each side,
    one after the other, the side that goes first swapped each round. A load in which the server
    dropped a connection (the client's connection error) is run again, up to :data:`TRIES` times in
    all, and counted in ``dropped``."""
    rows: dict[tuple[str, int], list[LoadRow]] = {}
    sides = list(servers)
    for round_ in range(args.rounds):
        order = sides if round_ % 2 == 0 else sides[::-1]
        for clients in args.clients:
            for side in order:
                row = load_once(args, servers[side], clients, prompts, dropped)
                rows.setdefault((side, clients), []).append(row)
                print(
                    f"round {round_ + 1} {side:>12} {clients:>2} clients: {row.total_bps:,.0f} B/s, "
                    f"TTFB p50 {row.ttfb_p50:.3f} s p99 {row.ttfb_p99:.3f} s",
                    flush=True,
                )
    return rows


TRIES = 3


def load_once(args, running: Running, clients: int, prompts: list[str], dropped: dict[str, int]) -> LoadRow:
    import openai

    tries = 0
    while True:
        try:
            return asyncio.run(
                load(
                    running.url,
                    running.side,
                    clients,
                    args.answers,
                    args.answer_bytes,
                    prompts,
                    running.process.pid,
                    REQUEST[running.side],
                )
            )
        except openai.APIConnectionError as error:
            tries += 1
            dropped[running.side] = dropped.get(running.side, 0) + 1
            print(f"{running.side} dropped a connection at {clients} clients ({error.__cause__!r})", flush=True)
            if tries == TRIES or running.process.poll() is not None:
                raise


@dataclass
class Side:
    """A side's figures at a count of clients: medians over the rounds."""

    side: str
    clients: int
    bps: float
    ttfb_p50: float
    ttfb_p99: float
    answers: int
    client_cores: float
    server_cores: float


def medians(rows: dict[tuple[str, int], list[LoadRow]]) -> dict[tuple[str, int], Side]:
    return {
        key: Side(
            key[0],
            key[1],
            statistics.median(r.total_bps for r in each),
            statistics.median(r.ttfb_p50 for r in each),
            statistics.median(r.ttfb_p99 for r in each),
            sum(r.answers for r in each),
            statistics.median(r.client_cores for r in each),
            statistics.median(r.server_cores for r in each),
        )
        for key, each in rows.items()
    }


def ratios(rows: dict[tuple[str, int], list[LoadRow]], clients: tuple[int, ...]) -> dict[int, float]:
    """Clients -> the median over rounds of ours/llama-server bytes/s in the same round."""
    return {
        n: statistics.median(o.total_bps / t.total_bps for o, t in zip(rows[(OURS, n)], rows[(THEIRS, n)]))
        for n in clients
        if (THEIRS, n) in rows
    }


# ------------------------------------------------------------------ the step at batch 1


def engine_step_ms(model, compile: bool, new: int, repeats: int) -> float:
    """Our engine's decode step at batch 1 in ms (a step is a byte): greedy from ``<bos>``, the time
    of ``new`` symbols less that of 1 (the prefill) over ``new`` - 1, the shortest of ``repeats``
    after a first run (which compiles, where compiled)."""
    from students.serving.engine import Engine
    from students.serving.requests import Request

    torch._dynamo.reset()
    engine = Engine(model, slots=1, compile=compile, stop=frozenset())

    def timed(n: int) -> float:
        start = time.perf_counter()
        engine.run([Request([BYTES.bos], b"", max_new_bytes=1 << 30, max_symbols=n)])
        return time.perf_counter() - start

    timed(new)
    total, prefill = best_of(lambda: timed(new), repeats), best_of(lambda: timed(1), repeats)
    return 1000 * max(total - prefill, 1e-9) / (new - 1)


def llama_bench_ms(binaries: Path, gguf: Path, new: int, threads: int, repeats: int) -> float:
    """``llama-bench``'s token generation (``-p 0 -n NEW``) in ms per token: its mean over ``repeats``."""
    command = [str(binaries / "llama-bench"), "-m", str(gguf), "-p", "0", "-n", str(new), "-t", str(threads),
               "-r", str(repeats), "-o", "json"]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"llama-bench failed ({result.returncode}): {result.stderr[-2000:]}")
    runs = [run for run in json.loads(result.stdout) if run.get("n_gen") == new and not run.get("n_prompt")]
    return 1000 / runs[0]["avg_ts"]


# ------------------------------------------------------------------ tables and the summary


def load_table(sides: dict[tuple[str, int], Side], ratio: dict[int, float], clients: tuple[int, ...]) -> list[str]:
    header = [
        "clients",
        "server",
        "answers",
        "B/s in all",
        "TTFB p50 s",
        "TTFB p99 s",
        "CPU cores: clients / server",
        "ours / llama-server B/s",
    ]
    body = []
    for n in clients:
        for side in (OURS, THEIRS):
            if (side, n) not in sides:
                continue
            s = sides[(side, n)]
            mark = f"{ratio[n]:.2f}x" if side == OURS and n in ratio else ""
            body.append([str(n), side, str(s.answers), f"{s.bps:,.0f}", f"{s.ttfb_p50:.3f}", f"{s.ttfb_p99:.3f}",
                         f"{s.client_cores:.2f} / {s.server_cores:.2f}", mark])  # fmt: skip
    return markdown_table(header, body).splitlines()


def step_table(steps: dict[str, float]) -> list[str]:
    body = [[name, f"{ms:.3f}", f"{1000 / ms:,.0f}"] for name, ms in steps.items()]
    return markdown_table(["batch-1 step", "ms/byte", "bytes/s"], body).splitlines()


def summary(sides, ratio: dict[int, float], steps: dict[str, float], ceiling: float | None, clients) -> str:
    """Each goal met or MISSED; where llama.cpp did not run, that said in place of its goals."""
    parts = []
    if ratio:
        for n in (8, 32):
            if n in ratio:
                parts.append(
                    verdict(f"ours / llama-server bytes/s at {n} clients {ratio[n]:.2f}x (goal > 1x)", ratio[n] > 1)
                )
        if 1 in ratio:
            parts.append(f"at 1 client {ratio[1]:.2f}x")
    else:
        parts.append(NOT_FOUND)
    most = max(clients)
    if (OURS, 1) in sides and (OURS, most) in sides and most > 1:
        scaling = sides[(OURS, most)].bps / sides[(OURS, 1)].bps
        theirs = ""
        if (THEIRS, 1) in sides and (THEIRS, most) in sides:
            theirs = f"; llama-server {sides[(THEIRS, most)].bps / sides[(THEIRS, 1)].bps:.1f}x"
        parts.append(
            verdict(
                f"ours {most} clients / 1 client bytes/s {scaling:.1f}x (steps at the bound: {ceiling:.1f}x{theirs}; "
                f"goal >= {GOAL_SCALING:.0f}x)",
                scaling >= GOAL_SCALING,
            )
        )
    if "llama-bench tg" in steps:
        best = min(v for k, v in steps.items() if k.startswith("engine"))
        each = ", ".join(f"{k} {v:.3f}" for k, v in steps.items())
        parts.append(
            verdict(
                f"batch-1 step ms/byte: {each}; ours / llama.cpp {best / steps['llama-bench tg']:.2f}x (goal <= 1x)",
                best <= steps["llama-bench tg"],
            )
        )
    return "summary: " + "; ".join(parts)


# ------------------------------------------------------------------ the run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument(
        "--llama-cpp-bin",
        default=None,
        help="folder of llama-server and llama-bench (default: $LLAMA_CPP_BIN, else the PATH's)",
    )
    parser.add_argument("--threads", type=int, default=1, help="threads of each server and of each batch-1 step")
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS), help="concurrent clients")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternating loads (ours, llama-server)")
    parser.add_argument("--answers", type=int, default=4, help="answers each client asks for, one after another")
    parser.add_argument("--answer-bytes", type=int, default=256, help="max_tokens (bytes) of each answer")
    parser.add_argument("--step-bytes", type=int, default=128, help="bytes decoded when timing the batch-1 step")
    parser.add_argument("--repeats", type=int, default=3, help="timings of each batch-1 step; the shortest counts")
    parser.add_argument(
        "--no-compiled-step", dest="compiled_step", action="store_false", help="time only the eager batch-1 step"
    )
    parser.add_argument("--markdown", action="store_true", help="also write the tables into docs/RESULTS.md")
    parser.add_argument("--smoke", action="store_true", help="toy size, few bytes, one round: seconds")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.rounds < 1 or args.answers < 1 or min(args.clients) < 1:
        parser.error("--threads, --rounds, --answers and --clients must be at least 1")
    if args.answer_bytes < 1 or args.step_bytes < 2 or args.repeats < 1:
        parser.error("--answer-bytes and --repeats must be at least 1, --step-bytes at least 2")
    binaries = llama_cpp_bin(args.llama_cpp_bin)
    if args.llama_cpp_bin and binaries is None:
        parser.error(f"--llama-cpp-bin {args.llama_cpp_bin}: no llama-server in it")
    size = SMOKE_SIZES[0] if args.smoke else SIZES[0]
    if args.smoke:
        args.clients, args.rounds, args.answers, args.answer_bytes, args.step_bytes = [1, 2], 1, 1, 16, 8
        args.repeats = 1
        args.compiled_step, args.markdown = False, False
    load_before = os.getloadavg()[0]
    torch.set_num_threads(args.threads)
    args.rate, args.bandwidth = matmul_rate("cpu", args.smoke), copy_rate("cpu", args.smoke)
    args.rates = BYTES_RATES  # what the serving benchmark's bound reads
    clients = tuple(args.clients)
    model = bytes_student(size)
    prompts = [text[:200].decode("utf-8", errors="ignore") for text in texts(args.smoke)[:32]]
    slots = max(clients)
    context = 1 + max(len(p.encode()) for p in prompts) + args.answer_bytes + 16
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folder, gguf = write_student(model, work)
        steps = {"engine eager": engine_step_ms(model, False, args.step_bytes, args.repeats)}
        if args.compiled_step:
            steps["engine compiled"] = engine_step_ms(model, True, args.step_bytes, args.repeats)
        if binaries is not None and (binaries / "llama-bench").is_file():
            steps["llama-bench tg"] = llama_bench_ms(binaries, gguf, args.step_bytes, args.threads, args.repeats)
        servers: dict[str, Running] = {}
        dropped: dict[str, int] = {}
        try:
            port = free_port()
            servers[OURS] = start_server(OURS, ours_command(folder, port, slots), port, args.threads, work / "ours.log")
            if binaries is not None:
                port = free_port()
                command = theirs_command(binaries, gguf, port, slots, args.threads, context)
                servers[THEIRS] = start_server(THEIRS, command, port, args.threads, work / "theirs.log")
            rows = load_rounds(args, servers, prompts, dropped)
        finally:
            for running in servers.values():
                stop(running)
    sides, ratio = medians(rows), ratios(rows, clients)
    ceiling = load_bound_bps(args, model, slots, prompts) / sides[(OURS, 1)].bps
    from students.models.llama import count_parameters

    intro = (
        f"cpu ({os.cpu_count()} cores, load {load_before:.1f} before the run); flat {size.name} bytes student "
        f"({count_parameters(model):,} parameters, random weights, f32 on both sides; the key/value cache f32 in ours, llama.cpp's default f16 in theirs, llama-bench having no f32 cache), {slots} slots, {args.threads} "
        f"thread(s) each, our step eager; {args.answer_bytes}-byte answers, {args.answers} per client a round; "
        f"{args.rounds} rounds alternating ours / llama-server (medians over rounds; each ratio the median of the "
        f"rounds' ratios); batch-1 step over {args.step_bytes} bytes, the shortest of {args.repeats}"
        + "".join(f"; {side} dropped a connection in {n} load(s), each run again" for side, n in dropped.items())
        + ("" if binaries else f"; {NOT_FOUND}")
    )
    lines = load_table(sides, ratio, clients) + [""] + step_table(steps)
    line = summary(sides, ratio, steps, ceiling, clients)
    print(intro)
    print("\n".join(lines))
    print(line)
    if args.markdown:
        write_section("peers", f"{intro}.\n\n" + "\n".join(lines) + f"\n\n`{line}`")


if __name__ == "__main__":
    main()
