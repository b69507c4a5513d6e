"""The decode engine and ``bytedistill serve`` under load: one run, two tables.

First the engine (``students/serving/engine.py``) against stock ``model.generate`` on the same
models (random weights: speed depends on shapes): flat and patched students at two sizes, and a
token model of each patched student's global shape (its layers × width, the teacher's
vocabulary) through the same engine. Every model replays real text (KJV Genesis; the stream
tokenizer's symbols from the Llama-3 tokenizer, the token models its tokens), so the patched
student steps its global model at the real patch rate: ``generate`` through a logits processor
that forces each symbol, the engine through its requests' ``replay``. Per model and batch, on one
thread: decoding in text bytes per second, the time of a step, the bound on it that counts both
its FLOPs (at a measured matrix-product rate) and the bytes it reads (weights and caches, at a
measured copy rate), its overhead (the step less that bound) and the share of the bound reached.
The engine's step runs eagerly and compiled (``--compiled-batches``: at which batch sizes, by
default every one, so that the batch-8 rows of the goal on the bound are the compiled step's; each
graph's first run, compiling included, is timed apart: a few seconds for a batch of 1, 20-45 s
for the graphs of a batch of 8 on a CPU); ``generate`` decodes eagerly (the issue's compiled
``generate`` figures are in docs/RESULTS.md, "Generation").

Then the server: a flat student served by ``bytedistill serve``'s server (in a process of its
own, one engine thread, as many slots as the most clients), once with its step eager and once
compiled as ``serve --compile`` deploys it (every graph compiled before the clients start; the time
it took printed, and the graphs compiled later while serving; ``--server-decode`` picks either),
and loaded by the official ``openai`` client: 1, 8 and 32 concurrent clients, each streaming
answers of 256 bytes (``max_tokens`` counts bytes; ``<eos>`` suppressed so every answer is whole):
bytes per second in all, beside the bytes per second of decode steps at the FLOPs-and-bytes bound
with every client's row in each (each row at the mean context the answers reach), and per client,
time to first byte and latency (p50, p99), and the CPU cores the clients' process and the server's
used (on a machine of few cores, the clients' share is taken from the server). The summary puts
beside the goal on 32 clients what steps at the bound would give over one client's measured
bytes/s: a fast one-client step leaves less to gain. Beside the engine, the flat students' step
exported to ONNX Runtime (``benchmarks/onnx_step.py``; the ``onnx`` extra) decodes the same
replays: the existing engine measured beside ours. Then a line starting ``summary`` with the
goals, each met or MISSED.
``--smoke`` runs toy sizes in seconds (a test).

    python -m benchmarks.serve [--markdown]                 # the engine compiled at batch 1 and 8: minutes
    python -m benchmarks.serve --device cuda --markdown     # the prepared GPU line (CUDA graphs)
    python -m benchmarks.serve --smoke
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import importlib.util
import math
import multiprocessing
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.generation import (
    SIZES,
    SMOKE_SIZES,
    TEACHER_VOCAB,
    Shape,
    flat_student,
    matmul_rate,
    patched_student,
    peak_rate,
    stream_rates,
    streams,
    sync,
    texts,
    timed_generate,
    token_model,
)
from benchmarks.results import markdown_table, write_section
from bytestream.stream_kind import StreamKind
from bytestream.stream_tokenizer import ByteStreamTokenizer
from students.models.architectures import student_cost
from students.models.llama import count_parameters
from students.serving.engine import Engine
from students.serving.requests import Request

GOAL_OVERHEAD_MS, GOAL_BOUND, GOAL_SCALING, GOAL_TTFB_S = 0.25, 0.5, 8.0, 1.0
CLIENTS = (1, 8, 32)


@dataclass
class EngineRow:
    model: str
    parameters: int
    batch: int
    path: str  # "generate (eager)" or "engine (compiled)" / "engine (eager)"
    decode_bps: float
    step_ms: float
    overhead_ms: float
    bound_bps: float
    first_run_s: float | None

    @property
    def of_bound(self) -> float:
        return self.decode_bps / self.bound_bps


@dataclass
class LoadRow:
    step: str  # the served engine's step: "eager" or "compiled"
    clients: int
    total_bps: float
    client_bps: float
    ttfb_p50: float
    ttfb_p99: float
    latency_p50: float
    latency_p99: float
    answers: int
    client_cores: float  # CPU seconds per second the clients' process used while loading
    server_cores: float  # the same for the server's process (nan: the server runs in the clients' process)
    bound_bps: float = math.nan  # bytes/s of decode steps at the FLOPs-and-bytes bound, every client's row in each

    @property
    def of_bound(self) -> float:
        return self.total_bps / self.bound_bps


def copy_rate(device: str, smoke: bool) -> float:
    """Bytes per second a large tensor copy reads (the memory bound of a step that reads its
    weights), at its peak."""
    n = (1 << 20) if smoke else (64 << 20)
    a = torch.empty(n // 4, device=device)
    b = torch.empty_like(a)
    return peak_rate(lambda: b.copy_(a), n, device, smoke)


def step_bytes(model, batch: int, context: float, patches_per_symbol: float) -> float:
    """Bytes one decode step reads: the weights it runs (a patched student's global ones only when
    some row closes a patch) and the keys/values its rows attend to."""
    cost = student_cost(model)
    element = next(model.parameters()).element_size()
    if cost.per_patch:  # patched: the local model every step, the global model when a row closes a patch
        closing = 1 - (1 - patches_per_symbol) ** batch
        weights = cost.local_parameters + cost.global_parameters * closing
        entries = context * patches_per_symbol  # global entries a row holds
        cache = batch * (
            cost.local_layers * 2 * cost.local_width * cost.local_window
            + patches_per_symbol * cost.global_layers * cost.kv_width * entries
        )
    else:
        weights = cost.parameters
        cache = batch * cost.global_layers * cost.kv_width * context
    return element * (weights + cache)


def bound_step_s(model, rates, batch: int, context: float, rate: float, bandwidth: float) -> float:
    """The least time a decode step of ``batch`` rows ``context`` symbols long can take: its FLOPs at
    the measured matrix-product rate or the bytes it reads at the measured copy rate, the larger."""
    patches = rates.patches_per_byte / rates.symbols_per_byte
    flops = student_cost(model).generate_flops_per_symbol(rates, context) * batch
    return max(flops / rate, step_bytes(model, batch, context, patches) / bandwidth)


def engine_time(engine: Engine, prompts, targets, new: int, device: str) -> float:
    requests = [
        Request(p.tolist(), b"", max_new_bytes=1 << 30, max_symbols=new, replay=tuple(t.tolist()))
        for p, t in zip(prompts, targets)
    ]
    sync(device)
    start = time.perf_counter()
    engine.run(requests)
    sync(device)
    return time.perf_counter() - start


def best_of(timed, repeats: int) -> float:
    """The shortest of ``repeats`` timings: what the work costs when nothing else on the machine
    interrupts it."""
    return min(timed() for _ in range(max(1, repeats)))


def measure_engine(name, model, args, batch: int, path: str, token: bool, size: Shape) -> EngineRow:
    per_byte = args.tokens_per_byte if token else args.rates.symbols_per_byte
    prompt, new = max(1, round(args.prompt_bytes * per_byte)), max(4, round(args.new_bytes * per_byte))
    prompts, targets = streams(args.tokenizer, args.data, batch, prompt, new, token)
    vocab = model.config.vocab_size
    prompts, targets = (prompts % vocab).to(args.device), (targets % vocab).to(args.device)
    model.to(args.device)
    first_run = None
    if path == "generate":
        timed_generate(model, prompts, targets, 2, args.device, {})  # warm up
        total, prefill = (
            best_of(lambda n=n: timed_generate(model, prompts, targets, n, args.device, {}), args.repeats)
            for n in (new, 1)
        )
    elif path == "onnxruntime":
        total, prefill = onnx_times(args, size, prompts, targets, new)
    else:
        torch._dynamo.reset()
        stream = StreamKind.EOT if token else None  # a token model's ids are no stream's: nothing stops it
        engine = Engine(model, slots=batch, compile=path == "compiled", stream=stream, stop=frozenset())
        first_run = engine_time(engine, prompts, targets, new, args.device)  # compiles every graph it meets
        total, prefill = (
            best_of(lambda n=n: engine_time(engine, prompts, targets, n, args.device), args.repeats) for n in (new, 1)
        )
    decode_s = max(total - prefill, 1e-9)
    step_s = decode_s / (new - 1)
    bound_s = bound_step_s(model, args.rates, batch, prompt + new / 2, args.rate, args.bandwidth)
    label = {"generate": "generate (eager)", "onnxruntime": "onnxruntime"}.get(path, f"engine ({path})")
    return EngineRow(
        name,
        count_parameters(model),
        batch,
        label,
        batch * (new - 1) / per_byte / decode_s,
        1000 * step_s,
        1000 * (step_s - bound_s),
        batch / per_byte / bound_s,
        first_run if path == "compiled" else None,
    )


def onnx_wanted(parser, args) -> bool:
    """Whether to measure ONNX Runtime: on the CPU, where it is installed (asked for: it must be)."""
    if args.device != "cpu" or args.onnxruntime is False:
        return False
    if importlib.util.find_spec("onnxruntime") and importlib.util.find_spec("onnxscript"):
        return True
    if args.onnxruntime:
        parser.error("--onnxruntime needs the onnx extra: pip install -e '.[onnx]'")
    print("ONNX Runtime rows skipped: the onnx extra is not installed (pip install -e '.[onnx]')", flush=True)
    return False


def onnx_times(args, size: Shape, prompts, targets, new: int) -> tuple[float, float]:
    """Seconds of ONNX Runtime's replay of ``new`` and of 1 symbol (the shortest of ``--repeats``)
    for the flat student of ``size``, in a process of its own: with ONNX Runtime loaded, this
    process's later torch steps ran up to 2.3 times slower (measured), so no other row shares it."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        job = pool.submit(onnx_replay, size, args.onnx_dir, prompts, targets, new, args.repeats)
        return job.result()


def onnx_replay(size: Shape, folder: Path, prompts, targets, new: int, repeats: int) -> tuple[float, float]:
    """The child process of :func:`onnx_times`: the flat student's step exported (once per size,
    into ``folder``) and replayed on one thread."""
    from benchmarks.onnx_step import OnnxDecoder, export_step

    torch.set_num_threads(1)
    model = flat_student(size)
    path = folder / f"flat-{size.name}.onnx"
    if not path.is_file():
        start = time.perf_counter()
        export_step(model, path)
        print(f"flat {size.name}: step exported to ONNX in {time.perf_counter() - start:.1f} s", flush=True)
    decoder = OnnxDecoder(model, path, prompts.shape[0])
    decoder.replay(prompts, targets, 2)  # warm up
    total, prefill = (best_of(lambda n=n: decoder.replay(prompts, targets, n), repeats) for n in (new, 1))
    return total, prefill


def engine_models(args):
    """(name, builder, token model?, size): flat and patched students and the token model of each
    patched student's global shape."""
    sizes: list[Shape] = (SMOKE_SIZES if args.smoke else SIZES)[: args.sizes]
    vocab = 512 if args.smoke else TEACHER_VOCAB
    for size in sizes:
        shape = {"hidden_size": size.hidden, "num_hidden_layers": size.layers, "num_attention_heads": size.heads}
        yield f"flat {size.name}", lambda size=size: flat_student(size), False, size
        yield f"patched {size.name}", lambda size=size: patched_student(size), False, size
        yield f"token model {size.name}", lambda shape=shape: token_model(shape, vocab), True, size


# ------------------------------------------------------------------ the server under load


def served_model(size: Shape):
    """The served student: flat, random weights, ``<eos>`` suppressed (every answer is whole)."""
    model = flat_student(size)
    stream = StreamKind.of_config(model.config)
    model.generation_config.suppress_tokens = [stream.bos, stream.pad, stream.eos]
    return model


def run_server(size: Shape, tokenizer_json: str, slots: int, compile: bool, device: str, threads: int, queue) -> None:
    """A child process: the server on a free port of 127.0.0.1 (the port put on ``queue``)."""
    torch.set_num_threads(threads)
    from students.serving.serve_options import ServeOptions
    from students.serving.server import ServedModel, Server

    model = served_model(size).to(device)
    tokenizer = ByteStreamTokenizer(teacher_tokenizer_file=tokenizer_json)
    engine = Engine(model, slots=slots, max_queue=4 * slots, compile=compile)
    options = ServeOptions(slots=slots, compile=compile)
    engine.start(warm_up=engine.graph_keys(options.warm_up_entries))  # as `serve --compile` does
    server = Server(ServedModel(engine, tokenizer, "student", options))
    queue.put((server.port, len(engine.graph_keys(options.warm_up_entries))))
    server.run()


def wait_ready(url: str, limit_s: float = 3600, exited=lambda: False) -> float:
    """Seconds until the server's /health says ready (200; 503 while it compiles), a refused
    connection waited out as a server not yet listening; ``exited`` says whether the server's
    process has ended (it is then an error, as is ``limit_s`` passing)."""
    import httpx

    start = time.perf_counter()
    while True:
        if exited():
            raise RuntimeError("the server exited before it was ready")
        try:
            if httpx.get(f"{url}/health", timeout=30).status_code == 200:
                return time.perf_counter() - start
        except httpx.TransportError:
            pass
        if time.perf_counter() - start > limit_s:
            raise TimeoutError(f"the server was not ready after {limit_s:.0f} s")
        time.sleep(0.5)


async def one_client(client, prompt: str, answers: int, max_bytes: int, record: list, request=None) -> None:
    """``answers`` streamed answers one after another, each recorded as (time to first text, latency,
    size). The size is the UTF-8 of the text received, or, where the server reports usage (``request``
    asks for it: ``stream_options``), its completion tokens: a bytes student's bytes, which the text
    received overcounts where they are not valid UTF-8 (each invalid one arrives as a 3-byte U+FFFD).
    ``request``: more arguments of each ``completions.create``."""
    for _ in range(answers):
        start = time.perf_counter()
        first, size, used = None, 0, None
        stream = await client.completions.create(
            model="student", prompt=prompt, max_tokens=max_bytes, temperature=1.0, stream=True, **(request or {})
        )
        async for chunk in stream:
            text = chunk.choices[0].text if chunk.choices else ""
            if text and first is None:
                first = time.perf_counter() - start
            size += len(text.encode())
            if getattr(chunk, "usage", None) is not None:
                used = chunk.usage.completion_tokens
        record.append((first or float("nan"), time.perf_counter() - start, size if used is None else used))


async def load(
    url: str,
    step: str,
    clients: int,
    answers: int,
    max_bytes: int,
    prompts: list[str],
    server_pid=None,
    request=None,
) -> LoadRow:
    """``clients`` concurrent clients, each streaming ``answers`` answers one after another; what
    they measured, and the CPU the clients' and (given its pid) the server's process used.
    ``request``: more arguments of each request (:func:`one_client`)."""
    import httpx
    import openai
    import psutil

    server = psutil.Process(server_pid) if server_pid else None

    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    async with openai.AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key="unused",
        max_retries=0,
        timeout=600,
        http_client=openai.DefaultAsyncHttpxClient(limits=limits),
    ) as client:
        await one_client(client, prompts[0], 1, 8, [], request)  # warm: a connection, the first step
        record: list = []
        start, client_cpu, server_cpu = time.perf_counter(), time.process_time(), _cpu_seconds(server)
        await asyncio.gather(
            *(
                one_client(client, prompts[i % len(prompts)], answers, max_bytes, record, request)
                for i in range(clients)
            )
        )
        wall = time.perf_counter() - start
        client_cpu, server_cpu = time.process_time() - client_cpu, _cpu_seconds(server) - server_cpu
    ttfb = sorted(r[0] for r in record)
    latency = sorted(r[1] for r in record)
    total = sum(r[2] for r in record)
    per_client = statistics.mean(r[2] / r[1] for r in record)
    return LoadRow(
        step,
        clients,
        total / wall,
        per_client,
        _quantile(ttfb, 0.5),
        _quantile(ttfb, 0.99),
        _quantile(latency, 0.5),
        _quantile(latency, 0.99),
        len(record),
        client_cpu / wall,
        server_cpu / wall,
    )


def _cpu_seconds(process) -> float:
    """CPU seconds (user and system) ``process`` has used so far (nan: none)."""
    if process is None:
        return math.nan
    times = process.cpu_times()
    return times.user + times.system


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def load_bound_bps(args, model, clients: int, prompts: list[str]) -> float:
    """Bytes/s of the served ``model``'s decode steps over ``clients`` rows at the FLOPs-and-bytes
    bound, each row at the mean context the answers reach (its prompt and half its answer)."""
    asked = [prompts[i % len(prompts)] for i in range(clients)]
    prompt_bytes = statistics.mean(len(prompt.encode()) for prompt in asked)
    per_byte = args.rates.symbols_per_byte
    context = 1 + (prompt_bytes + args.answer_bytes / 2) * per_byte
    step_s = bound_step_s(model, args.rates, clients, context, args.rate, args.bandwidth)
    return clients / per_byte / step_s


def load_rows(args, size: Shape, step: str, url: str, prompts: list[str], server_pid=None) -> list[LoadRow]:
    """A load row per count of clients, printed as it comes, with its bound."""
    model, rows = served_model(size), []  # its shape for the bound: the server holds its own copy
    for clients in args.clients:
        row = asyncio.run(load(url, step, clients, args.answers, args.answer_bytes, prompts, server_pid))
        row.bound_bps = load_bound_bps(args, model, clients, prompts)
        print(load_table([row])[-1], flush=True)
        rows.append(row)
    return rows


def measure_server(args, size: Shape, step: str) -> list[LoadRow]:
    """The load rows of a server of its own process whose engine runs its ``step`` eager or compiled
    (as ``serve --compile``: its graphs compiled before the clients start, the time it took kept)."""
    from benchmarks.common import llama3_tokenizer_json

    slots = max(args.clients)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(
        target=run_server,
        args=(
            size,
            str(llama3_tokenizer_json()),
            slots,
            step == "compiled",
            args.device,
            args.server_threads,
            queue,
        ),
        daemon=True,
    )
    child.start()
    try:
        port, graphs = queue.get(timeout=300)
        url = f"http://127.0.0.1:{port}"
        ready_s = wait_ready(url)
        if graphs:
            args.warm_up = (graphs, ready_s)
        print(f"{step} server ready after {ready_s:.1f} s ({graphs} graphs compiled first)", flush=True)
        prompts = [text[:200].decode("utf-8", errors="ignore") for text in args.data[:32]]
        rows = load_rows(args, size, step, url, prompts, child.pid)
        if graphs:  # a row past the warmed cache sizes compiles while clients wait
            import httpx

            later = httpx.get(f"{url}/health", timeout=30).json()["graphs_compiled"] - graphs
            print(f"graphs compiled while serving: {later}", flush=True)
        return rows
    finally:
        child.terminate()
        child.join()


# ------------------------------------------------------------------ tables and the summary


def engine_table(rows: list[EngineRow]) -> list[str]:
    header = [
        "model",
        "parameters",
        "batch",
        "decoding",
        "decode B/s",
        "ms/step",
        "overhead ms",
        "bound B/s",
        "of bound",
        "first run s",
    ]
    body = [
        [
            r.model,
            f"{r.parameters:,}",
            str(r.batch),
            r.path,
            f"{r.decode_bps:,.0f}",
            f"{r.step_ms:.3f}",
            f"{r.overhead_ms:.3f}",
            f"{r.bound_bps:,.0f}",
            f"{100 * r.of_bound:.1f}%",
            "" if r.first_run_s is None else f"{r.first_run_s:.1f}",
        ]
        for r in rows
    ]
    return markdown_table(header, body).splitlines()


def load_table(rows: list[LoadRow]) -> list[str]:
    header = [
        "server step",
        "clients",
        "answers",
        "B/s in all",
        "bound B/s",
        "of bound",
        "B/s per client",
        "TTFB p50 s",
        "TTFB p99 s",
        "latency p50 s",
        "latency p99 s",
        "CPU cores: clients / server",
    ]
    body = [
        [
            r.step,
            str(r.clients),
            str(r.answers),
            f"{r.total_bps:,.0f}",
            f"{r.bound_bps:,.0f}",
            f"{100 * r.of_bound:.0f}%",
            f"{r.client_bps:,.0f}",
            f"{r.ttfb_p50:.3f}",
            f"{r.ttfb_p99:.3f}",
            f"{r.latency_p50:.2f}",
            f"{r.latency_p99:.2f}",
            f"{r.client_cores:.2f} / " + ("(one process)" if math.isnan(r.server_cores) else f"{r.server_cores:.2f}"),
        ]
        for r in rows
    ]
    return markdown_table(header, body).splitlines()


def summary(engine_rows: list[EngineRow], load_rows: list[LoadRow]) -> str:
    """The goals on the engine's compiled rows where measured (else its eager ones), each met or MISSED."""
    rows = {(r.model, r.batch, r.path): r for r in engine_rows}
    for r in engine_rows:  # the engine's best-measured path under one name
        key = (r.model, r.batch, "engine")
        if r.path == "engine (compiled)" or (r.path == "engine (eager)" and key not in rows):
            rows[key] = r
    path = "engine"
    sizes = list(dict.fromkeys(r.model.removeprefix("flat ") for r in engine_rows if r.model.startswith("flat ")))
    batches = sorted({r.batch for r in engine_rows})
    one, b8 = batches[0], (8 if 8 in batches else batches[-1])
    parts = []
    try:
        small = sizes[0]
        overheads = {kind: rows[(f"{kind} {small}", one, path)].overhead_ms for kind in ("flat", "patched")}
        stock = {kind: rows[(f"{kind} {small}", one, "generate (eager)")].step_ms for kind in ("flat", "patched")}
        which = rows[(f"flat {small}", one, path)].path
        parts.append(
            verdict(
                f"{which} per-step overhead at batch {one}, size {small}, 1 thread: flat {overheads['flat']:.3f} ms, patched "
                f"{overheads['patched']:.3f} ms (stock generate's whole step {stock['flat']:.2f} / {stock['patched']:.2f} ms; "
                f"goal <= {GOAL_OVERHEAD_MS} ms)",
                max(overheads.values()) <= GOAL_OVERHEAD_MS,
            )
        )
        large = sizes[-1]
        shares = {kind: rows[(f"{kind} {large}", b8, path)].of_bound for kind in ("flat", "patched")}
        parts.append(
            verdict(
                f"{rows[(f'flat {large}', b8, path)].path}, batch {b8}, size {large}: flat {100 * shares['flat']:.0f}%, patched {100 * shares['patched']:.0f}% of "
                f"the FLOPs-and-bytes bound (goal >= {100 * GOAL_BOUND:.0f}%)",
                min(shares.values()) >= GOAL_BOUND,
            )
        )
        ratios = [
            rows[(f"patched {s}", b, path)].decode_bps / rows[(f"token model {s}", b, path)].decode_bps
            for s in sizes
            for b in batches
            if b <= 8
        ]
        parts.append(
            verdict(
                f"patched / token model of its global shape, same engine: {min(ratios):.2f}x at worst (goal >= 1x)",
                min(ratios) >= 1.0,
            )
        )
    except KeyError as missing:
        parts.append(f"engine goals: not measured ({missing} missing)")
    parts += onnx_comparison(rows)
    parts += load_goals(load_rows)
    return "summary: " + "; ".join(parts)


def verdict(text: str, met: bool) -> str:
    return f"{text}: {'met' if met else 'MISSED'}"


def load_goals(load_rows: list[LoadRow]) -> list[str]:
    """The server's goals (scaling with clients, time to first byte at 8) for each served step; what
    the bound allows beside the first."""
    steps = list(dict.fromkeys(r.step for r in load_rows))
    by_step = {step: {r.clients: r for r in load_rows if r.step == step} for step in steps}
    most = max((r.clients for r in load_rows), default=1)
    parts, scalings, ceilings = [], {}, {}
    for step, by_clients in by_step.items():
        if 1 in by_clients and most in by_clients and most > 1:
            scalings[step] = by_clients[most].total_bps / by_clients[1].total_bps
            ceilings[step] = by_clients[most].bound_bps / by_clients[1].total_bps
    if scalings:
        each = ", ".join(
            f"{step} step {scalings[step]:.1f}x (steps at the bound: {ceilings[step]:.1f}x)" for step in scalings
        )
        text = f"{most} clients / 1 client, bytes/s: {each} (goal >= {GOAL_SCALING:.0f}x)"
        parts.append(verdict(text, max(scalings.values()) >= GOAL_SCALING))
    p99 = {step: by_clients[8].ttfb_p99 for step, by_clients in by_step.items() if 8 in by_clients}
    if p99:
        each = ", ".join(f"{step} step {value:.3f} s" for step, value in p99.items())
        parts.append(
            verdict(f"TTFB p99 at 8 clients: {each} (goal < {GOAL_TTFB_S:.0f} s)", max(p99.values()) < GOAL_TTFB_S)
        )
    return parts


def onnx_comparison(rows: dict) -> list[str]:
    """ONNX Runtime's bytes/s against the engine's on the same flat models and batches, and the
    engine the numbers choose."""
    ratios = {
        (model, batch): rows[(model, batch, "engine")].decode_bps / row.decode_bps
        for (model, batch, path), row in rows.items()
        if path == "onnxruntime" and (model, batch, "engine") in rows
    }
    if not ratios:
        return []
    each = ", ".join(f"{model} batch {batch} {ratio:.2f}x" for (model, batch), ratio in ratios.items())
    mean = statistics.geometric_mean(ratios.values())
    behind = [f"{model} batch {batch}" for (model, batch), ratio in ratios.items() if ratio < 1]
    chosen = "the engine kept" if mean >= 1 else "ONNX Runtime ahead"
    where = f"; ONNX Runtime ahead at {', '.join(behind)}" if behind else ""
    return [f"engine / onnxruntime, flat students: {each} (geometric mean {mean:.2f}x: {chosen}{where})"]


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, or cuda where a GPU is lent")
    parser.add_argument("--sizes", type=int, default=2, help="how many student sizes (S, M, L)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="engine batch sizes")
    parser.add_argument("--new-bytes", type=int, default=128, help="text bytes each row decodes (engine table)")
    parser.add_argument("--prompt-bytes", type=int, default=64, help="text bytes of each prompt (engine table)")
    parser.add_argument(
        "--compiled-batches",
        type=int,
        nargs="*",
        default=None,
        help="batch sizes at which the engine's step is also compiled (default: every batch, 8 included: the "
        "goal on the bound is read at batch 8; none: eager only)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timings of each decode (and of its prefill); the shortest counts"
    )
    parser.add_argument("--clients", type=int, nargs="+", default=list(CLIENTS), help="concurrent clients")
    parser.add_argument("--answers", type=int, default=2, help="answers each client asks for, one after another")
    parser.add_argument("--answer-bytes", type=int, default=256, help="max_tokens (bytes) of each answer")
    parser.add_argument(
        "--server-decode",
        choices=["eager", "compiled"],
        nargs="+",
        default=["eager", "compiled"],
        help="the served engine's step, a server for each (compiled: as `serve --compile`, its graphs compiled "
        "before the clients start, the time it took printed: 60 graphs for 32 slots, minutes on 2 CPU cores "
        "the first time)",
    )
    parser.add_argument("--server-threads", type=int, default=1, help="torch threads of the server process")
    parser.add_argument(
        "--onnxruntime",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also decode the flat students' step on ONNX Runtime (CPU only, exported once per model; default: "
        "where the onnx extra is installed)",
    )
    parser.add_argument("--markdown", action="store_true", help="also write the tables into docs/RESULTS.md")
    parser.add_argument("--smoke", action="store_true", help="toy sizes and lengths: seconds")
    args = parser.parse_args()
    if args.smoke:
        args.sizes, args.batches, args.new_bytes, args.prompt_bytes = 1, [1, 2], 12, 8
        args.repeats = 1
        args.compiled_batches, args.clients, args.answers, args.answer_bytes = [], [1, 2], 1, 16
    from benchmarks.common import llama3_tokenizer_json

    torch.set_num_threads(1)
    args.onnxruntime = onnx_wanted(parser, args)
    onnx_dir = tempfile.TemporaryDirectory()
    args.onnx_dir = Path(onnx_dir.name)
    args.tokenizer = ByteStreamTokenizer(teacher_tokenizer_file=str(llama3_tokenizer_json()))
    args.data = texts(args.smoke)
    args.rates, args.tokens_per_byte = stream_rates(args.tokenizer, args.data)
    args.rate, args.bandwidth = matmul_rate(args.device, args.smoke), copy_rate(args.device, args.smoke)
    print(
        f"1 thread: matrix products at {args.rate / 1e9:.1f} GFLOP/s, copies at {args.bandwidth / 1e9:.1f} GB/s",
        flush=True,
    )
    engine_rows = []
    for name, build, token, size in engine_models(args):
        model = build().eval()
        model.generation_config.suppress_tokens = None
        for batch in args.batches:
            compiled = args.compiled_batches is None or batch in args.compiled_batches
            paths = ([] if token else ["generate"]) + ["eager"] + (["compiled"] if compiled else [])
            paths += ["onnxruntime"] if args.onnxruntime and name.startswith("flat") else []
            for path in paths:
                row = measure_engine(name, model, args, batch, path, token, size)
                engine_rows.append(row)
                print(engine_table([row])[-1], flush=True)
    sizes = SMOKE_SIZES if args.smoke else SIZES
    args.warm_up = (0, 0.0)
    if args.smoke:  # the server in this process: no second interpreter to start
        served_rows = smoke_server(args, sizes[0])
    else:
        served_rows = [row for step in args.server_decode for row in measure_server(args, sizes[0], step)]
    device = (
        torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    )
    served = (
        f"server: flat {sizes[0].name}, {max(args.clients)} slots, {' and '.join(args.server_decode)} step, "
        f"{args.server_threads} thread(s), {args.answer_bytes}-byte answers"
        + (f", ready after compiling {args.warm_up[0]} graphs in {args.warm_up[1]:.0f} s" if args.warm_up[0] else "")
    )
    print(
        f"{device}; engine: {args.new_bytes} bytes after {args.prompt_bytes}, 1 thread (compiled at batches "
        f"{'all' if args.compiled_batches is None else args.compiled_batches}); {served}"
    )
    lines = engine_table(engine_rows) + [""] + load_table(served_rows)
    line = summary(engine_rows, served_rows)
    print("\n".join(lines))
    print(line)
    if args.markdown and not args.smoke:
        block = f"On {device}; {served}.\n\n" + "\n".join(lines) + f"\n\n`{line}`"
        write_section("serve" if args.device == "cpu" else "serve_cuda", block)


def smoke_server(args, size: Shape) -> list[LoadRow]:
    from benchmarks.common import llama3_tokenizer_json
    from students.serving.serve_options import ServeOptions
    from students.serving.server import ServedModel, Server

    tokenizer = ByteStreamTokenizer(teacher_tokenizer_file=str(llama3_tokenizer_json()))
    engine = Engine(served_model(size), slots=max(args.clients))
    engine.start()
    server = Server(ServedModel(engine, tokenizer, "student", ServeOptions())).start()
    try:
        return load_rows(args, size, "eager", server.url, ["In the begi"])
    finally:
        server.stop()


if __name__ == "__main__":
    main()
