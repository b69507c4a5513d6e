"""The ``bytes`` student against the fused student on plain bytes: one run, one table.

The real SmolLM2-135M teacher's fused stores of KJV text (Genesis to train on, in two amounts:
the quickstart's 12 chapters, scarce, and 50, plenty; Ruth and Jonah held out, as
``benchmarks/fused.py``). Per flat size and amount: the fused student at the recipe's steps, the
``bytes`` student (docs/DESIGN.md, "The bytes stream") at equal steps and at equal training FLOPs
(as many steps as the fused run's FLOPs pay for). Each is scored on the held-out text as plain
bytes, in pieces of ``--seq-len`` - 1 bytes each read from ``<bos>`` (the first ``--score-bytes``
bytes), with next-byte probabilities that depend on past bytes only: the ``bytes`` student's own
bits per byte; the fused student placing its own flags (at each byte, of the two flags the one it
finds more probable for that byte is fed back) with the flag summed out, P(b) = P(b, ends) +
P(b, goes on). For reference beside them: the fused student's stream BPB (bytes and the teacher's
flags jointly), its flag-summed BPB given the teacher's flags (optimistic: the teacher's flag on a
byte depends on the bytes after it) and the teacher's token BPB (each piece's tokens after the
teacher's BOS). The same pieces with typos (5% of letters swapped with the next character, dropped
or doubled, seeded) and transliterated to Greek letters (a fixed letter map: a script the training
text lacks, two bytes a letter) give each model's BPB increase over clean text, the teacher's
included. Then decode bytes/s at batch 1 and 8 (greedy, ``<eos>`` not stopping): the ``bytes``
student in our engine (``students/serving``, eager step) and in llama.cpp (``bytedistill export``
then ``export-gguf --type f32``, ``llama_cpp.Llama`` on as many threads as torch; batch 8 is 8
streams decoded one after another by one ``Llama``, llama-cpp-python having no batched decode),
next to the fused student in our engine. A line starting ``summary`` gives the default-stream rule
(docs/DESIGN.md, "The bytes stream") at each size and amount, met or missed.

    OMP_NUM_THREADS=2 python -m benchmarks.bytes_student [--workdir runs/bytes-student] [--markdown]
    python -m benchmarks.bytes_student --device cuda --workdir runs/bytes-student-gpu --steps 2000 \\
        --batch-size 32 --seq-len 512 --sizes-scale 2     # the prepared GPU line
    python -m benchmarks.bytes_student --smoke    # seconds: a check that the benchmark runs

Stores and runs are cached under ``--workdir`` (a rerun only measures).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from benchmarks import fused, patched
from benchmarks.fused import Student, flops_per_step, listed, train_student, verdict
from benchmarks.patched import Recipe, Size, dump_store
from benchmarks.results import markdown_table, write_section
from bytestream.stream_kind import StreamKind

RULE_BPB = 0.02  # the default-stream rule: bytes within this of fused self-flagged at equal FLOPs
TYPO_RATE = 0.05
AMOUNTS = {"scarce": fused.QUICKSTART_CHAPTERS, "plenty": 50}
SMOKE_AMOUNTS = {"scarce": 1, "plenty": 2}
SIZES = [Size("flat-64x4", "flat", 64, 4, 2), Size("flat-128x4", "flat", 128, 4, 4)]
SMOKE_SIZES = [Size("flat-16x1", "flat", 16, 1, 1), Size("flat-32x1", "flat", 32, 1, 2)]
GREEK = dict(zip("abcdefghijklmnopqrstuvwxyz", "αβψδεφγηιξκλμνοπ;ρστθωςχυζ"))
GREEK |= {latin.upper(): greek.upper() for latin, greek in GREEK.items() if greek != ";"}
GREEK["q"], GREEK["Q"] = "ϙ", "Ϙ"


def real_recipe() -> Recipe:
    return replace(patched.real_recipe(), sizes=SIZES)


def smoke_recipe() -> Recipe:
    return replace(patched.smoke_recipe(), sizes=SMOKE_SIZES)


# ------------------------------------------------------------------------------ stores and students


@dataclass(frozen=True)
class Stores:
    """A fused train store and the held-out one; ``stream`` is what a student reads from them."""

    stream: StreamKind
    train: Path
    heldout: Path
    rates: object  # StreamRates of the training store

    def read_as(self, stream: StreamKind) -> Stores:
        return replace(self, stream=stream)


def dumped_stores(work: Path, recipe: Recipe, amounts: dict[str, int]) -> dict[str, Stores]:
    from students.models.cost import StreamRates, rates_of_stores

    heldout = dump_store(work, "heldout-fused", *recipe.heldout, recipe.teacher, stream="fused")
    out = {}
    for amount, chapters in amounts.items():
        train = dump_store(work, f"train-fused-{chapters}", recipe.train[0], chapters, recipe.teacher, stream="fused")
        out[amount] = Stores(StreamKind.FUSED, train, heldout, StreamRates(**rates_of_stores([train])))
    return out


def students_of(size: Size, amount: str, stores: Stores, args) -> list[Student]:
    """The fused student, the bytes one at equal steps and the bytes one at equal training FLOPs."""
    ratio = flops_per_step(size, stores, args) / flops_per_step(size, stores.read_as(StreamKind.BYTES), args)
    return [
        Student(size, StreamKind.FUSED, args.steps, amount),
        Student(size, StreamKind.BYTES, args.steps, amount),
        Student(size, StreamKind.BYTES, max(round(args.steps * ratio), 1), f"{amount}-equal-flops"),
    ]


# ------------------------------------------------------------------------------ held-out texts


def heldout_texts(work: Path, score_bytes: int, piece_bytes: int) -> list[str]:
    """The first ``score_bytes`` bytes of the held-out documents, in pieces of at most ``piece_bytes``."""
    lines = (work / "corpus" / "heldout-fused" / "kjv.jsonl").read_text(encoding="utf-8").splitlines()
    pieces, left = [], score_bytes
    for text in (json.loads(line)["text"] for line in lines if line.strip()):
        for piece in cut(text, piece_bytes):
            if left <= 0:
                return pieces
            pieces.append(piece[:left])
            left -= len(pieces[-1].encode("utf-8"))
    return pieces


def cut(text: str, piece_bytes: int) -> list[str]:
    """``text`` in pieces whose UTF-8 is at most ``piece_bytes`` long, cut between characters."""
    pieces, piece, size = [], [], 0
    for char in text:
        n = len(char.encode("utf-8"))
        if size + n > piece_bytes:
            pieces.append("".join(piece))
            piece, size = [], 0
        piece.append(char)
        size += n
    return pieces + ["".join(piece)] if piece else pieces


def with_typos(text: str, rng: random.Random) -> str:
    """``text`` with each letter, at rate :data:`TYPO_RATE`, swapped with the next character, dropped or doubled."""
    chars, out, i = list(text), [], 0
    while i < len(chars):
        char = chars[i]
        if char.isalpha() and rng.random() < TYPO_RATE:
            kind = rng.choice(("swap", "drop", "double"))
            if kind == "swap" and i + 1 < len(chars):
                out += [chars[i + 1], char]
                i += 2
                continue
            out += [] if kind == "drop" else [char, char]
        else:
            out.append(char)
        i += 1
    return "".join(out)


def variants(pieces: list[str]) -> dict[str, list[str]]:
    rng = random.Random(0)
    return {
        "clean": pieces,
        "typos": [with_typos(piece, rng) for piece in pieces],
        "greek": ["".join(GREEK.get(c, c) for c in piece) for piece in pieces],
    }


# ------------------------------------------------------------------------------ scoring


@dataclass
class Bits:
    """Bits summed over a text's pieces, and its bytes."""

    bits: float = 0.0
    bytes: int = 0

    def add(self, bits: float, data: bytes) -> None:
        self.bits += bits
        self.bytes += len(data)

    @property
    def bpb(self) -> float:
        return self.bits / self.bytes


@torch.no_grad()
def bytes_bits(model, data: bytes, device: str) -> float:
    """The bytes student's bits for ``data`` read from ``<bos>``."""
    from bytestream.alphabet import BYTES_BOS

    ids = torch.tensor([[BYTES_BOS, *data]], device=device)
    logp = torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)
    return -float(logp.gather(1, ids[0, 1:, None]).sum()) / math.log(2)


def teacher_flagged(tokens, data: bytes) -> list[int]:
    """``data``'s fused symbols with the teacher's flags: a token's last byte flagged "ends"."""
    from bytestream.alphabet import FUSED_ENDS

    symbols = []
    for _, spelled, _ in tokens.encode(data):
        symbols += [*spelled[:-1], FUSED_ENDS + spelled[-1]]
    return symbols


@torch.no_grad()
def fused_teacher_flag_bits(model, tokens, data: bytes, device: str) -> tuple[float, float]:
    """The fused student's bits for ``data`` with the teacher's flags fed: of the stream (bytes and
    flags jointly) and with the flag summed out at each byte."""
    from bytestream.alphabet import FUSED_BOS, NUM_BYTES

    ids = torch.tensor([[FUSED_BOS, *teacher_flagged(tokens, data)]], device=device)
    logp = torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)
    target = ids[0, 1:, None]
    stream = -float(logp.gather(1, target).sum())
    byte = target % NUM_BYTES
    summed = torch.logaddexp(logp.gather(1, byte), logp.gather(1, byte + NUM_BYTES))
    return stream / math.log(2), -float(summed.sum()) / math.log(2)


@torch.no_grad()
def fused_self_flag_bits(model, data: bytes, device: str) -> float:
    """The fused student's bits for ``data`` placing its own flags: at each byte the flag summed out,
    then of its two flagged symbols the more probable one fed back (one cached step a byte)."""
    from transformers import DynamicCache

    from bytestream.alphabet import FUSED_BOS, NUM_BYTES

    cache, bits = DynamicCache(), 0.0
    fed = torch.tensor([[FUSED_BOS]], device=device)
    for byte in data:
        out = model(input_ids=fed, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logp = torch.log_softmax(out.logits[0, -1].double(), dim=-1)
        goes_on, ends = logp[byte], logp[NUM_BYTES + byte]
        bits -= float(torch.logaddexp(goes_on, ends)) / math.log(2)
        fed = torch.tensor([[byte if goes_on >= ends else NUM_BYTES + byte]], device=device)
    return bits


@torch.no_grad()
def teacher_bits(teacher, tokens, data: bytes) -> float:
    """The teacher's bits for ``data``'s tokens after its context prefix (BOS or end-of-text)."""
    prefix = teacher.context_prefix
    ids = torch.tensor([[*prefix, *(i for i, _, _ in tokens.encode(data))]], device=teacher.device)
    logp = torch.log_softmax(teacher.model(ids).logits[0, len(prefix) - 1 : -1].double(), dim=-1)
    return -float(logp.gather(1, ids[0, len(prefix) :, None]).sum()) / math.log(2)


def teacher_tokens(teacher):
    from bytestream.teacher_tokens import TeacherTokens

    return TeacherTokens(teacher.tokenizer.backend_tokenizer.to_str())


def score_student(model, stream: StreamKind, texts: dict[str, list[str]], tokens, device: str) -> dict[str, float]:
    """Plain-byte BPB per variant (``bytes`` own, fused self-flagged); a fused student's clean-text
    stream BPB and flag-summed BPB given the teacher's flags too."""
    scores = {}
    for variant, pieces in texts.items():
        plain = Bits()
        for data in (piece.encode("utf-8") for piece in pieces):
            bits = bytes_bits if stream is StreamKind.BYTES else fused_self_flag_bits
            plain.add(bits(model, data, device), data)
        scores[variant] = plain.bpb
    if stream is StreamKind.FUSED:
        joint, summed = Bits(), Bits()
        for data in (piece.encode("utf-8") for piece in texts["clean"]):
            stream_bits, summed_bits = fused_teacher_flag_bits(model, tokens, data, device)
            joint.add(stream_bits, data)
            summed.add(summed_bits, data)
        scores |= {"stream": joint.bpb, "teacher_flags": summed.bpb}
    return scores


def score_teacher(teacher, tokens, texts: dict[str, list[str]]) -> dict[str, float]:
    scores = {}
    for variant, pieces in texts.items():
        total = Bits()
        for data in (piece.encode("utf-8") for piece in pieces):
            total.add(teacher_bits(teacher, tokens, data), data)
        scores[variant] = total.bpb
    return scores


# ------------------------------------------------------------------------------ speed


def engine_speed(model, stream: StreamKind, batch: int, new_bytes: int) -> float:
    """Our engine's decode bytes/s (eager step): ``batch`` greedy rows of ``new_bytes`` symbols after ``<bos>``."""
    from students.serving.engine import Engine
    from students.serving.requests import Request

    engine = Engine(model, slots=batch, stop=frozenset())
    requests = [Request([stream.bos], b"", max_new_bytes=1 << 30, max_symbols=new_bytes) for _ in range(batch)]
    start = time.perf_counter()
    engine.run(requests)
    return batch * new_bytes / (time.perf_counter() - start)


def gguf_of(work: Path, run: Path, name: str) -> Path:
    """The bytes student's GGUF (f32): ``bytedistill export`` then ``export-gguf`` (cached)."""
    from bytedistill.cli import main as bytedistill

    folder, gguf = work / "export" / name, work / "export" / f"{name}.f32.gguf"
    if not gguf.is_file():
        if bytedistill(["export", str(run), str(folder)]) != 0:
            raise SystemExit(f"export of {name} failed")
        if bytedistill(["export-gguf", "--type", "f32", str(folder), str(gguf)]) != 0:
            raise SystemExit(f"export-gguf of {name} failed")
    return gguf


def llama_cpp_speed(gguf: Path, streams: int, new_bytes: int) -> float:
    """llama.cpp's decode bytes/s: ``streams`` greedy continuations of ``new_bytes`` bytes after
    ``<bos>``, one after another, on torch's thread count."""
    import llama_cpp

    from bytestream.alphabet import BYTES_BOS

    threads = torch.get_num_threads()
    model = llama_cpp.Llama(str(gguf), n_ctx=new_bytes + 8, n_threads=threads, seed=0, verbose=False)
    try:
        start = time.perf_counter()
        for _ in range(streams):
            tokens = model.generate([BYTES_BOS], top_k=1, temp=0.0, repeat_penalty=1.0, reset=True)
            for produced, _token in enumerate(tokens, start=1):
                if produced == new_bytes:
                    break
        return streams * new_bytes / (time.perf_counter() - start)
    finally:
        model.close()


# ------------------------------------------------------------------------------ the run


@dataclass
class Row:
    student: Student
    train_flops: float  # the whole run's
    scores: dict[str, float]
    speeds: dict[str, float]  # "engine b1", "engine b8", "llama.cpp b1", "llama.cpp b8"


def measure(work: Path, run: Path, student: Student, stores: Stores, texts, tokens, args) -> Row:
    from students.release.trained_student import load_student, resolve_checkpoint

    model = load_student(resolve_checkpoint(run)).to(args.device).eval()
    run_flops = student.steps * flops_per_step(student.size, stores.read_as(student.stream), args)
    scores = score_student(model, student.stream, texts, tokens, args.device)
    speeds = {}
    if student.label in AMOUNTS_LABELS:  # speed once per size and stream: the weights do not change it
        for batch in (1, 8):
            speeds[f"engine b{batch}"] = engine_speed(model, student.stream, batch, args.new_bytes)
        if student.stream is StreamKind.BYTES and args.device == "cpu":
            gguf = gguf_of(work, run, student.name)
            for batch in (1, 8):
                speeds[f"llama.cpp b{batch}"] = llama_cpp_speed(gguf, batch, args.new_bytes)
    return Row(student, run_flops, scores, speeds)


AMOUNTS_LABELS = {"plenty"}


def report(rows: list[Row], teacher: dict[str, float], recipe: Recipe, amounts: dict[str, int], args):
    header = ["student", "text", "steps", "run FLOPs", "plain BPB", "+typos", "+greek", "stream BPB"]
    header += ["teacher-flag BPB", "engine B/s b1", "engine B/s b8", "llama.cpp B/s b1", "llama.cpp B/s b8"]

    def speed(row: Row, key: str) -> str:
        return f"{row.speeds[key]:,.0f}" if key in row.speeds else ""

    def score(row: Row, key: str) -> str:
        return f"{row.scores[key]:.3f}" if key in row.scores else ""

    table_rows = [
        [
            f"{r.student.size.name}-{r.student.stream.value}",
            r.student.label,
            f"{r.student.steps}",
            f"{r.train_flops:.3g}",
            f"{r.scores['clean']:.3f}",
            f"{r.scores['typos'] - r.scores['clean']:+.3f}",
            f"{r.scores['greek'] - r.scores['clean']:+.3f}",
            score(r, "stream"),
            score(r, "teacher_flags"),
            *(speed(r, k) for k in ("engine b1", "engine b8", "llama.cpp b1", "llama.cpp b8")),
        ]
        for r in rows
    ]
    table_rows.append(
        [
            f"teacher {recipe.teacher_name}",
            "",
            "",
            "",
            f"{teacher['clean']:.3f}",
            f"{teacher['typos'] - teacher['clean']:+.3f}",
            f"{teacher['greek'] - teacher['clean']:+.3f}",
            "",
            "",
            "",
            "",
            "",
            "",
        ]
    )
    intro = (
        f"teacher {recipe.teacher_name}; fused stores of the first {', '.join(f'{n} ({a})' for a, n in amounts.items())} "
        f"chapters of Genesis; scored on the first {args.score_bytes} bytes of {', '.join(recipe.heldout[0])} in pieces of "
        f"{args.seq_len - 1} bytes from <bos>; steps of {args.batch_size} x {args.seq_len} symbols, lr 3e-3 with a tenth "
        f"of the run warming up, alpha 0.9; plain BPB: bytes students their own, fused students self-flagged; +typos, "
        f"+greek: BPB increase over clean text (greek: bits per byte of the transliterated text); decode "
        f"{args.new_bytes} bytes a row after <bos>, greedy, {args.device}, {torch.get_num_threads()} threads "
        f"(llama.cpp b8: 8 streams one after another)"
    )
    summary = summary_line(rows, teacher, recipe, amounts)
    table = markdown_table(header, table_rows)
    return [intro, table, summary], f"{intro}\n\n{table}\n\n{summary}"


def summary_line(rows: list[Row], teacher: dict[str, float], recipe: Recipe, amounts: dict[str, int]) -> str:
    def row(size: Size, stream: str, label: str) -> Row:
        return next(
            r for r in rows if r.student.size == size and r.student.stream.value == stream and r.student.label == label
        )

    parts, rule_met = [], {}
    for amount in amounts:
        flops_gaps, step_gaps = [], []
        for size in recipe.sizes:
            base = row(size, "fused", amount).scores["clean"]
            flops_gaps.append(row(size, "bytes", f"{amount}-equal-flops").scores["clean"] - base)
            step_gaps.append(row(size, "bytes", amount).scores["clean"] - base)
        met = [gap <= RULE_BPB for gap in flops_gaps]
        rule_met[amount] = all(met)
        parts.append(
            f"{amount}: at equal training FLOPs {listed(flops_gaps, '+.3f')} "
            f"({', '.join(verdict(m) for m in met)}, rule <= +{RULE_BPB}), at equal steps {listed(step_gaps, '+.3f')}"
        )
    robust = []
    for variant in ("typos", "greek"):
        rise = {"teacher": teacher[variant] - teacher["clean"]}
        for stream in ("bytes", "fused"):
            rise[stream] = max(
                r.scores[variant] - r.scores["clean"]
                for r in rows
                if r.student.stream.value == stream and r.student.label in amounts
            )
        robust.append(
            f"{variant} BPB increase bytes {rise['bytes']:+.3f}, fused {rise['fused']:+.3f}, teacher {rise['teacher']:+.3f} "
            f"(byte models degrade less than the teacher: {verdict(max(rise['bytes'], rise['fused']) < rise['teacher'])})"
        )
    rule = ", ".join(f"{amount} {'met' if met else 'MISSED'}" for amount, met in rule_met.items())
    return (
        f"summary: plain-byte BPB bytes - fused self-flagged at equal training FLOPs, "
        f"{'; '.join(parts)} (sizes in order: {', '.join(s.name for s in recipe.sizes)}); default-stream rule "
        f"(bytes within {RULE_BPB} at both sizes): {rule}; worst {'; '.join(robust)}"
    )


def compare(args, recipe: Recipe, amounts: dict[str, int]) -> list[str]:
    if args.device == "cpu":
        os.environ["ACCELERATE_USE_CPU"] = "1"
    from distill.teacher.model import load_teacher

    work = args.workdir
    stores = dumped_stores(work, recipe, amounts)
    students = [
        (student, stores[amount])
        for size in recipe.sizes
        for amount in amounts
        for student in students_of(size, amount, stores[amount], args)
    ]
    runs = {s.name: train_student(work, s, st.read_as(s.stream), args) for s, st in students}
    texts = variants(heldout_texts(work, args.score_bytes, args.seq_len - 1))
    teacher = load_teacher(recipe.teacher, device=args.device)
    tokens = teacher_tokens(teacher)
    teacher_scores = score_teacher(teacher, tokens, texts)
    del teacher
    torch.manual_seed(0)
    rows = [measure(work, runs[s.name], s, st, texts, tokens, args) for s, st in students]
    lines, markdown = report(rows, teacher_scores, recipe, amounts, args)
    print("\n".join(lines))
    if args.markdown:
        write_section("bytes_student", markdown)
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--workdir", type=Path, default=Path("runs/bytes-student"), help="stores and runs go here")
    parser.add_argument("--steps", type=int, default=120, help="optimizer steps of the fused students")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=256, help="symbols per sequence")
    parser.add_argument("--sizes-scale", type=int, default=1, help="multiply every width by this (GPU runs)")
    parser.add_argument("--score-bytes", type=int, default=2048, help="held-out bytes scored per text variant")
    parser.add_argument("--new-bytes", type=int, default=256, help="bytes to decode per row when timing")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (training, scoring and timing)")
    parser.add_argument("--markdown", action="store_true", help="also write the table to docs/RESULTS.md")
    parser.add_argument("--smoke", action="store_true", help="toy sizes in a temporary folder (seconds): a check")
    args = parser.parse_args(argv)
    if not args.smoke:
        compare(args, real_recipe(), AMOUNTS)
        return
    args.steps, args.batch_size, args.seq_len, args.sizes_scale, args.device = 3, 2, 64, 1, "cpu"
    args.score_bytes, args.new_bytes, args.markdown = 96, 16, False
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = Path(tmp)
        compare(args, smoke_recipe(), SMOKE_AMOUNTS)


if __name__ == "__main__":
    main()
