"""Generation speed of byte students against token models: one run, one table.

Models (random weights: speed depends on shapes, not on what was learned): a token model of the
teacher's shape (SmolLM2-135M: 30 layers × 576, its 49,152-token vocabulary) through stock
``generate``; flat and patched students at a few sizes, the patched student's global model of the
flat one's shape; and a token model of the patched student's global shape (same layers × width,
the teacher's vocabulary). Every model replays real text (KJV chapters, the stream tokenizer's
``<eot>`` marks from the Llama-3 tokenizer; the token models its tokens) through ``generate`` with
a logits processor that forces the next symbol, so the patched student steps its global model at
the real patch rate. Per model, batch and thread count: prompt processing and decoding, in text
bytes per second, separately (prefill = ``generate`` of one symbol; decoding = the rest); the
per-step time; the FLOPs-implied bound (forward FLOPs per byte from ``students/models/cost.py`` against
a measured matrix-product rate) and the share of it reached. Each model decodes eagerly and on the
compiled path (``students/models/decode.py``: static caches, ``torch.compile``; compiling is
timed apart, by a first run of the same shapes, with dynamo reset before each model and batch so
each row runs the static graph a fresh process would). Then a line starting ``summary`` with the
goals (``GOAL_*``) on the compiled rows (the eager figures beside them), each met or missed.
``--smoke`` runs toy sizes in seconds (a test).

    python -m benchmarks.generation [--threads 1 0] [--batches 1 8 32] [--new-bytes 512] [--decode eager compiled] [--markdown]
    python -m benchmarks.generation --device cuda --threads 0     # the prepared GPU line
    python -m benchmarks.generation --smoke
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM, LogitsProcessor, LogitsProcessorList

from benchmarks.results import write_section
from bytestream.alphabet import NUM_BYTES, PAD
from bytestream.stream_kind import StreamKind
from bytestream.stream_tokenizer import ByteStreamTokenizer
from common.errors import first_line
from students.models.architectures import student_cost
from students.models.cost import StreamRates
from students.models.decode import compiled_decoding
from students.models.llama import build_student, count_parameters, student_config
from students.models.patched_model import PatchedStudent, PatchedStudentConfig

TEACHER_VOCAB = 49152
GOAL_OVERHEAD_MS, GOAL_RATIO, GOAL_BOUND = 1.0, 2.5, 0.5


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    local_hidden: int = 128


SIZES = [Shape("S", 128, 4, 4, 64), Shape("M", 256, 6, 8), Shape("L", 512, 8, 8)]
SMOKE_SIZES = [Shape("S", 32, 2, 2, 16), Shape("M", 64, 2, 4, 32)]
TEACHER = {"hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3}


@dataclass
class Row:
    model: str
    parameters: int
    batch: int
    threads: int
    decode: str  # "eager" or "compiled"
    prompt_bps: float
    decode_bps: float
    step_ms: float
    bound_bps: float
    overhead_ms: float
    compile_s: float | None  # the compiled path's first run of these shapes (compiling included)

    @property
    def of_bound(self) -> float:
        return self.decode_bps / self.bound_bps


class Replay(LogitsProcessor):
    """Force each row's next symbol from ``targets`` (B, N): generation replays real text."""

    def __init__(self, targets: torch.Tensor, prompt_length: int):
        self.targets, self.prompt_length = targets, prompt_length
        self.rows = torch.arange(targets.shape[0], device=targets.device)

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.prompt_length
        forced = torch.full_like(scores, float("-inf"))
        forced[self.rows, self.targets[:, step]] = 0.0
        return forced


def texts(smoke: bool) -> list[bytes]:
    try:
        from benchmarks.common import kjv_chapters

        return [text for _, text in kjv_chapters({"Genesis"})]
    except (SystemExit, OSError):
        if not smoke:
            raise
        return [(f"In the beginning {i} God created the heaven and the earth. " * 40).encode() for i in range(40)]


def streams(tokenizer: ByteStreamTokenizer, data: list[bytes], batch: int, prompt: int, new: int, tokens: bool):
    """(prompts (B, prompt), continuations (B, new), text bytes per row in each): symbols or teacher tokens."""
    rows = []
    for text in data:
        ids = tokenizer.teacher.ids(text) if tokens else tokenizer.encode_bytes(text)
        if len(ids) >= prompt + new:
            rows.append(ids[: prompt + new])
        if len(rows) == batch:
            break
    ids = torch.tensor((rows * batch)[:batch])
    return ids[:, :prompt], ids[:, prompt:]


def stream_rates(tokenizer: ByteStreamTokenizer, data: list[bytes]) -> tuple[StreamRates, float]:
    """Symbols and patches per byte of the stream, and the teacher's tokens per byte."""
    sample = b"".join(data[:8])
    symbols = tokenizer.encode_bytes(sample)
    patches = sum(1 for s in symbols if s >= NUM_BYTES)
    return StreamRates(len(symbols) / len(sample), patches / len(sample)), len(tokenizer.teacher.ids(sample)) / len(
        sample
    )


def peak_rate(work, amount: float, device: str, smoke: bool) -> float:
    """``amount`` per second of ``work()`` repeated on ``device``: the best of five timed windows, so
    that a moment of other work on the machine does not lower the rate."""
    work()
    best = 0.0
    for _ in range(5):
        sync(device)
        start, runs = time.perf_counter(), 0
        while time.perf_counter() - start < (0.01 if smoke else 0.2):
            work()
            runs += 1
        sync(device)
        best = max(best, amount * runs / (time.perf_counter() - start))
    return best


def matmul_rate(device: str, smoke: bool) -> float:
    """FLOP/s of a square float32 matrix product on ``device`` (the threads set), at its peak."""
    n = 256 if smoke else 1024
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return peak_rate(lambda: a @ b, 2 * n**3, device, smoke)


def sync(device: str) -> None:
    """Wait for the device's queued work (a GPU's): timings end when the work does."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


@torch.no_grad()
def timed_generate(model, prompts, targets, new: int, device: str, decoding: dict) -> float:
    sync(device)
    start = time.perf_counter()
    model.generate(
        **decoding,
        input_ids=prompts,
        attention_mask=torch.ones_like(prompts),
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=PAD,
        logits_processor=LogitsProcessorList([Replay(targets, prompts.shape[1])]),
    )
    sync(device)
    return time.perf_counter() - start


def measure(name, model, data, args, batch, threads, decode, rate, per_byte: float, rates, token: bool) -> Row:
    """One row: ``per_byte`` is the model's symbols (or tokens) per text byte; ``decode`` "eager" or "compiled"."""
    prompt = max(1, round(args.prompt_bytes * per_byte))
    new = max(2, round(args.new_bytes * per_byte))
    prompts, targets = streams(args.tokenizer, data, batch, prompt, new, token)
    vocab = model.config.vocab_size  # a token model of another vocabulary replays the ids modulo its own
    prompts, targets = (prompts % vocab).to(args.device), (targets % vocab).to(args.device)
    model.to(args.device)
    decoding = {}
    if decode == "compiled":
        torch._dynamo.reset()  # this model and batch's own static graph, as in a fresh process
        decoding = compiled_decoding(model)
        if args.smoke and "compile_config" in decoding:  # dynamo traces each model's step whole; inductor's
            decoding["compile_config"].backend = "eager"  # code is tests/test_decode.py's (minutes of a cold CI)
        compile_s = timed_generate(model, prompts, targets, new, args.device, decoding)  # compiles these shapes
    else:
        compile_s = None
        timed_generate(model, prompts, targets, 2, args.device, decoding)  # warm up
    prefill = timed_generate(model, prompts, targets, 1, args.device, {})  # the prompt runs eagerly either way
    total = timed_generate(model, prompts, targets, new, args.device, decoding)
    decode_s = max(total - prefill, 1e-9)
    new_bytes = new / per_byte * batch
    cost = student_cost(model)
    flops_per_byte = cost.generate_flops_per_symbol(rates, prompt + new // 2) * per_byte
    step_s = decode_s / (new - 1)
    model_s = flops_per_byte / per_byte * batch / rate  # the FLOPs-implied time of one step
    return Row(
        name,
        count_parameters(model),
        batch,
        threads,
        decode,
        prompt * batch / per_byte / prefill,
        new_bytes / decode_s,
        1000 * step_s,
        rate / flops_per_byte,
        1000 * (step_s - model_s),
        compile_s,
    )


def token_model(shape: dict, vocab: int) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=vocab, intermediate_size=shape["hidden_size"] * 8 // 3, **shape)
    config.max_position_embeddings, config.tie_word_embeddings = 4096, True
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


def flat_student(size: Shape, stream: StreamKind = StreamKind.EOT) -> LlamaForCausalLM:
    """The flat student of ``size`` over ``stream``'s alphabet (random weights, seed 0)."""
    config = student_config(
        "tiny",
        hidden_size=size.hidden,
        num_layers=size.layers,
        num_heads=size.heads,
        intermediate_size=size.hidden * 3,
        max_positions=4096,
        stream=stream,
    )
    return build_student(config, seed=0).eval()


def patched_student(size: Shape) -> PatchedStudent:
    torch.manual_seed(0)
    config = PatchedStudentConfig(
        local_hidden_size=size.local_hidden,
        local_heads=max(2, size.local_hidden // 32),
        local_intermediate_size=size.local_hidden * 3,
        global_hidden_size=size.hidden,
        global_layers=size.layers,
        global_heads=size.heads,
        global_intermediate_size=size.hidden * 3,
        max_position_embeddings=4096,
    )
    return PatchedStudent(config).eval()


def models(args, rates: StreamRates, tokens_per_byte: float):
    """(name, builder, symbols or tokens per byte, token model?) of every model in the table."""
    sizes = (SMOKE_SIZES if args.smoke else SIZES)[: args.sizes]
    vocab = 512 if args.smoke else TEACHER_VOCAB
    if not args.smoke:  # a toy teacher would run the token models' code again (and compile it: seconds)
        yield "teacher-shaped token model", lambda: token_model(TEACHER, vocab), tokens_per_byte, True
    for size in sizes:
        shape = {"hidden_size": size.hidden, "num_hidden_layers": size.layers, "num_attention_heads": size.heads}
        yield f"flat {size.name}", lambda size=size: flat_student(size), rates.symbols_per_byte, False
        yield f"patched {size.name}", lambda size=size: patched_student(size), rates.symbols_per_byte, False
        yield f"token model {size.name}", lambda shape=shape: token_model(shape, vocab), tokens_per_byte, True


def table(rows: list[Row], markdown: bool) -> list[str]:
    header = [
        "model",
        "parameters",
        "batch",
        "threads",
        "decoding",
        "prompt B/s",
        "decode B/s",
        "ms/step",
        "bound B/s",
        "of bound",
        "first run s",
    ]
    body = [
        [
            r.model,
            f"{r.parameters:,}",
            str(r.batch),
            str(r.threads),
            r.decode,
            f"{r.prompt_bps:,.0f}",
            f"{r.decode_bps:,.0f}",
            f"{r.step_ms:.2f}",
            f"{r.bound_bps:,.0f}",
            f"{100 * r.of_bound:.1f}%",
            "" if r.compile_s is None else f"{r.compile_s:.1f}",
        ]
        for r in rows
    ]
    if markdown:
        return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
            "| " + " | ".join(b) + " |" for b in body
        ]
    widths = [max(len(x) for x in column) for column in zip(header, *body)]
    return ["| " + " | ".join(x.ljust(w) for x, w in zip(line, widths)) + " |" for line in [header, *body]]


def summary(rows: list[Row]) -> str:
    """The goals, each met or missed (or not measured, where a row failed), on the most threads
    measured and the compiled rows (the eager overhead beside, where both were measured)."""
    threads = max(r.threads for r in rows)
    eager = {(r.model, r.batch): r for r in rows if r.threads == threads and r.decode == "eager"}
    compiled = {(r.model, r.batch): r for r in rows if r.threads == threads and r.decode == "compiled"}
    at = eager | compiled  # the compiled rows where --decode measured them, else the eager ones
    decoding = "compiled" if compiled else "eager"
    batches = sorted({r.batch for r in rows})
    b8, one = (8 if 8 in batches else batches[-1]), batches[0]
    sizes = list(dict.fromkeys(m.removeprefix("flat ") for m, _ in at if m.startswith("flat ")))
    small, large = sizes[0], sizes[-1]

    def row(model: str, batch: int, among: dict = at) -> Row:
        if (model, batch) not in among:
            raise LookupError(f"{model} at batch {batch}")
        return among[(model, batch)]

    def overhead() -> tuple[str, bool]:
        worst = max(row(f"{kind} {small}", one).overhead_ms for kind in ("flat", "patched"))
        before = ""
        if decoding != "eager" and eager:
            before = (
                f", eager {max(row(f'{kind} {small}', one, eager).overhead_ms for kind in ('flat', 'patched')):.2f} ms"
            )
        text = f"per-step overhead {worst:.2f} ms at batch {one}, {decoding}{before} (goal <= {GOAL_OVERHEAD_MS} ms)"
        return text, worst <= GOAL_OVERHEAD_MS

    def patched_over_flat() -> tuple[str, bool]:
        ratio = row(f"patched {large}", b8).decode_bps / row(f"flat {large}", b8).decode_bps
        text = f"patched/flat {ratio:.2f}x at batch {b8}, size {large} (goal >= {GOAL_RATIO}x; random weights: BPB not measured)"
        return text, ratio >= GOAL_RATIO

    def patched_over_token_model() -> tuple[str, bool]:
        worst = min(
            row(f"patched {s}", b).decode_bps / row(f"token model {s}", b).decode_bps
            for s in sizes
            for b in batches
            if b <= 8
        )
        return f"patched/token model of its global shape {worst:.2f}x at worst (goal >= 1x)", worst >= 1.0

    def share_of_bound() -> tuple[str, bool]:
        share = min(row(f"{kind} {large}", b8).of_bound for kind in ("flat", "patched"))
        text = f"batch-{b8} decode of size {large} at {100 * share:.0f}% of the FLOPs bound (goal >= {100 * GOAL_BOUND:.0f}%)"
        return text, share >= GOAL_BOUND

    parts = []
    for goal in (overhead, patched_over_flat, patched_over_token_model, share_of_bound):
        try:
            text, met = goal()
            parts.append(f"{text}: {'met' if met else 'MISSED'}")
        except LookupError as missing:
            parts.append(f"{goal.__name__.replace('_', ' ')}: not measured ({missing} failed)")
    return "summary: " + "; ".join(parts) + f" ({threads} threads, {decoding} decoding)"


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu, or cuda where a GPU is lent")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 0], help="thread counts (0: all)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32], help="batch sizes (prompts at once)")
    parser.add_argument("--new-bytes", type=int, default=512, help="text bytes each row generates")
    parser.add_argument("--prompt-bytes", type=int, default=64, help="text bytes of each prompt")
    parser.add_argument("--sizes", type=int, default=3, help="how many student sizes (S, M, L)")
    parser.add_argument(
        "--decode", nargs="+", choices=["eager", "compiled"], default=["eager", "compiled"], help="decoding paths"
    )
    parser.add_argument("--markdown", action="store_true", help="a markdown table, also written into docs/RESULTS.md")
    parser.add_argument("--smoke", action="store_true", help="toy sizes and lengths: seconds")
    args = parser.parse_args()
    if args.smoke:
        args.threads, args.batches, args.new_bytes, args.prompt_bytes, args.sizes = [1], [1], 24, 16, 1
    from benchmarks.common import llama3_tokenizer_json

    args.tokenizer = ByteStreamTokenizer(teacher_tokenizer_file=str(llama3_tokenizer_json()))
    data = texts(args.smoke)
    rates, tokens_per_byte = stream_rates(args.tokenizer, data)
    all_threads = torch.get_num_threads()
    rows = []
    for threads in args.threads:
        torch.set_num_threads(threads or all_threads)
        rate = matmul_rate(args.device, args.smoke)
        print(f"threads {threads or all_threads}: matrix products at {rate / 1e9:.1f} GFLOP/s", flush=True)
        for name, build, per_byte, token in models(args, rates, tokens_per_byte):
            model = build()
            for batch in args.batches:
                for decode in args.decode:
                    try:
                        row = measure(
                            name, model, data, args, batch, threads or all_threads, decode, rate, per_byte, rates, token
                        )
                    except Exception as error:  # one failing row (a new device) keeps the others
                        if args.smoke:
                            raise
                        print(f"FAILED {name}, batch {batch}, {decode}: {type(error).__name__}: {first_line(error)}")
                        continue
                    rows.append(row)
                    print(table([row], markdown=True)[-1], flush=True)  # progress: each row as it is measured
    device = (
        torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    )
    print(
        f"{device}; {args.new_bytes} new bytes after {args.prompt_bytes}; {rates.symbols_per_byte:.3f} symbols, "
        f"{rates.patches_per_byte:.3f} patches and {tokens_per_byte:.3f} teacher tokens per byte (KJV, Llama-3 tokenizer)"
    )
    lines, line = table(rows, args.markdown), summary(rows)
    print("\n".join(lines))
    print(line)
    if args.markdown and not args.smoke:
        block = f"On {device}.\n\n" + "\n".join(lines) + f"\n\n`{line}`"
        if args.device == "cpu":
            write_section("generation", block)
        else:  # a GPU's run keeps a section of its own beside the CPU's
            write_section("generation_cuda", block)


if __name__ == "__main__":
    main()
