"""On-policy training (docs/DESIGN.md, "On-policy distillation"): a share λ of each batch's
sequences is written by the student and scored exactly by the teacher.

Every sequence of a run is named by its epoch, its split and its window's index j in the split
(:meth:`students.training.store_windows.SplitBatches.origin`); window j is replaced when
``⌊λ·(j+1)⌋ − ⌊λ·j⌋`` is 1, so the share is λ over any run of a split's windows, and which windows
are replaced, like the answers written for them (seeded by the same name,
:func:`students.training.on_policy_writer.sequence_seed`), depends neither on the number of
processes nor on where a run was resumed. Each replaced window gives a prompt
(:func:`students.training.on_policy_writer.prompt_of`; in a conversation
:func:`students.training.on_policy_writer.chat_prompt_of`: up to an assistant turn);
the student continues it (:func:`students.training.on_policy_writer.write_answers`); the teacher
reads prompt + answer as one document, exactly as ``dump`` would
(:class:`students.training.on_policy_teacher.ScoringTeacher`), and the sequence the student then
trains on is the teacher's stream of that text: its token ends (``<eot>`` or the fused flags) are
the teacher's tokenization's, not the ones the student wrote. The loss counts the positions after
the prompt (:func:`on_policy_row`) with the divergence of
:mod:`students.training.on_policy_loss`; the other sequences keep the offline loss.

:class:`OnPolicy` owns the cost: seconds and FLOPs of writing, of the teacher's forward, of the
conversion, and of the student's step, which ``train`` logs and prints; and the answers of the
logging steps (:meth:`OnPolicy.record`). It holds no sampling state: a checkpoint needs none.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from bytestream.bytes_stream import as_read
from bytestream.stream_kind import StreamKind
from common.devices import parse_device
from common.errors import UserError
from common.files import append_text
from students.models.cost import StreamRates
from students.training.loss import ASSISTANT, LossConfig, LossOutput
from students.training.on_policy_config import OnPolicyConfig, check_on_policy, prompt_budget
from students.training.on_policy_loss import mixed_loss
from students.training.on_policy_writer import (
    Answer,
    chat_prompt_of,
    prompt_of,
    sequence_seed,
    write_answers,
)

if TYPE_CHECKING:  # the teacher side (Numba's conversion) loads only for an on-policy run
    from distill.conversion.converter import DocumentDistributions
    from students.training.on_policy_teacher import ScoringTeacher

PARTS = ("write", "teacher", "conversion", "student")  # the parts of a step's time and FLOPs


def check_before_run(config, chat: bool) -> None:
    """Refuse, before a run touches anything, on-policy settings that cannot run and a ``--teacher``
    that is not the training stores' (``config``: a :class:`TrainConfig`)."""
    on_policy: OnPolicyConfig = config.on_policy
    check_on_policy(on_policy, config.batches.seq_len, config.student.stream_kind, chat)
    if on_policy.enabled:
        from students.training.on_policy_teacher import refuse_other_teacher

        for store in config.train_stores:
            refuse_other_teacher(on_policy.teacher, store)


def written_by_student(share: float, window: int) -> bool:
    """Whether the student writes the sequence of window ``window`` of its split (a share ``share`` of them)."""
    return math.floor(share * (window + 1) + 1e-9) - math.floor(share * window + 1e-9) == 1


def on_policy_row(
    dist: DocumentDistributions, answer: Answer, seq_len: int, stream: StreamKind
) -> dict[str, np.ndarray]:
    """One training sequence from the teacher's conversion of ``answer``'s prompt + answer: the
    teacher's stream as inputs and targets, its distributions as the targets' teacher, and the
    positions counted: those whose target is the answer's (a byte or special it wrote, or a token end
    closing a token that holds one of its bytes: the token end that closes the prompt's last token is
    the prompt's), and a final ``<eos>`` only if the student wrote it; of an answer cut at its byte
    budget (not ended), none after its last byte. A stream longer than ``seq_len`` inputs keeps its
    last ``seq_len`` (the answer always fits: :func:`prompt_budget`)."""
    symbols, probs = as_read(stream, dist.layout.symbols.astype(np.int64), dist.dense())  # the student's stream
    inputs, targets = symbols[:-1], symbols[1:]

    def units(x: np.ndarray) -> np.ndarray:  # text bytes and reserved symbols (specials)
        return (x < stream.text_symbols) | (x >= stream.alphabet_size)

    read = np.cumsum(units(inputs))  # units read through each input
    closes = targets == stream.eot if stream.eot is not None else np.zeros(len(targets), dtype=bool)
    counted = np.where(closes, read - 1, read) >= answer.prompt_units  # the unit a target is or closes
    if not answer.wrote_eos:
        counted &= targets != stream.eos
    if not answer.ended:
        last = np.flatnonzero(units(targets))
        counted &= np.arange(len(targets)) <= (last[-1] if len(last) else -1)
    probs = probs.astype(np.float32)
    start = max(0, len(inputs) - seq_len)
    n = len(inputs) - start
    row = {
        "input_ids": np.full(seq_len, stream.pad, dtype=np.int64),
        "target_ids": np.full(seq_len, stream.pad, dtype=np.int64),
        "loss_mask": np.zeros(seq_len, dtype=bool),
        "probs": np.zeros((seq_len, probs.shape[1]), dtype=np.float32),
    }
    row["input_ids"][:n], row["target_ids"][:n] = inputs[start:], targets[start:]
    row["loss_mask"][:n], row["probs"][:n] = counted[start:], probs[start:]
    return row


def readable(teacher: ScoringTeacher, answer: Answer) -> tuple[Answer, np.ndarray | None, bool]:
    """The answer, the teacher's ids of prompt + answer, and whether it was cut: an answer with bytes
    the teacher cannot read exactly (a byte without a token) is cut to its longest prefix it can
    read, and counts as not ended (None: not even the prompt reads)."""
    encoded = teacher.encode_pieces(answer.pieces())
    if encoded is not None:
        return answer, encoded, False
    for cut in range(len(answer.text) - 1, -1, -1):
        shorter = answer.cut(cut)
        encoded = teacher.encode_pieces(shorter.pieces())
        if encoded is not None:
            return shorter, encoded, True
    return answer, None, False


@dataclass
class _Tally:
    """Seconds and work since the last report."""

    steps: int = 0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    flops: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    step_seconds: float = 0.0
    sequences: int = 0
    unscored: int = 0  # answers the teacher cannot encode exactly: their windows stay offline
    no_turn: int = 0  # windows of conversations with no assistant turn to write: they stay offline
    cut: int = 0  # answers cut before a byte the teacher cannot read
    divergence: float = 0.0
    micro_batches: int = 0


class OnPolicy:
    """The student's writing and the teacher's scoring inside a training run."""

    def __init__(
        self,
        config: OnPolicyConfig,
        teacher: ScoringTeacher,
        *,
        stream: StreamKind,
        seq_len: int,
        batch_size: int,
        grad_accum: int,
        seed: int,
        student_cost,
    ):
        if teacher.stream is not stream.stored:
            raise UserError(f"--teacher scores the {teacher.stream.shown} stream; this student reads {stream.shown}")
        self.config, self.teacher, self.stream = config, teacher, stream
        self.seq_len, self.batch_size, self.grad_accum = seq_len, batch_size, grad_accum
        self.budget = prompt_budget(config, seq_len, stream)
        self.seed = seed
        self.cost = student_cost
        absent = teacher.absent_bytes()  # symbols of bytes the teacher never reads: never drawn
        self.never = tuple(absent) + (tuple(256 + b for b in absent) if stream is StreamKind.FUSED else ())
        # a conversation's answer ends with the template's end of turn; the other specials are never drawn
        self.reserved = teacher.reserved_ids()
        self.alphabet = stream.alphabet_size + len(self.reserved)
        self.stops = tuple(int(s) for s in as_read(stream, np.asarray(teacher.turn_end_symbols(), dtype=np.int64))[0])
        self.never += tuple(s for s in range(stream.alphabet_size, self.alphabet) if s not in self.stops)
        self.tally, self.total = _Tally(), _Tally()
        self._symbols = [0.0, 0.0, 0.0]  # stream symbols, text bytes and teacher tokens scored (rates)
        self._step_started = 0.0
        self.answers: list[tuple[int, int, int, Answer]] = []

    @classmethod
    def start(cls, config, accelerator, model) -> OnPolicy:
        """The on-policy part of a run (``config``: its :class:`TrainConfig`), its teacher loaded."""
        from students.models.architectures import student_cost
        from students.training.on_policy_teacher import ScoringTeacher

        device = parse_device(config.on_policy.teacher_device, "--teacher-device", auto=accelerator.device)
        teacher = ScoringTeacher.load(config.on_policy.teacher, config.train_stores[0], device)
        return cls(
            config.on_policy,
            teacher,
            stream=config.student.stream_kind,
            seq_len=config.batches.seq_len,
            batch_size=config.batches.batch_size,
            grad_accum=config.batches.grad_accum,
            seed=config.seed,
            student_cost=student_cost(accelerator.unwrap_model(model)),
        )

    # -- a step
    def step_started(self) -> None:
        self._step_started = time.perf_counter()
        self.answers: list[tuple[int, int, int, Answer]] = []  # this step's: epoch, split, window, answer

    def step_finished(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - self._step_started
        for tally in (self.tally, self.total):
            tally.steps += 1
            tally.step_seconds += seconds
        sequences = self.seq_len * self.batch_size * self.grad_accum
        self._add("student", 0.0, self.cost.train_flops_per_symbol(self.rates(), self.seq_len) * sequences)

    def mix(self, batch: dict[str, torch.Tensor], model, origin: tuple[int, int, int]) -> dict[str, torch.Tensor]:
        """``batch`` (on the host) with the sequences due replaced by the student's own, scored;
        ``origin``: the batch's epoch, split and first window (:attr:`BatchStream.origin`)."""
        epoch, split, first = origin
        due = [i for i in range(len(batch["input_ids"])) if written_by_student(self.config.share, first + i)]
        prompts = {i: self.prompt(batch, i) for i in due}
        due = [i for i in due if prompts[i] is not None]
        seeds = [sequence_seed(self.seed, epoch, split, first + i) for i in due]
        answers = self.write([prompts[i] for i in due], model, seeds) if due else []
        rows, kept = self.score(answers)
        self.answers += [(epoch, split, first + due[i], answers[i]) for i in range(len(answers))]
        return self.with_rows(batch, rows, [due[i] for i in kept])

    def prompt(self, batch: dict[str, torch.Tensor], row: int) -> Answer | None:
        """The prompt of a batch row's window, as an answer not yet written (None: a window of a
        conversation with no assistant turn to write, which stays offline)."""
        inputs = batch["input_ids"][row].numpy()
        if self.teacher.chat is None:
            return Answer(prompt_of(inputs, self.stream, self.budget), (), b"", False)
        found = chat_prompt_of(inputs, batch["roles"][row].numpy(), self.stream, self.budget - 1, self.reserved)
        if found is None:
            for tally in (self.tally, self.total):
                tally.no_turn += 1
            return None
        return Answer(found[0], (), b"", False, found[1])

    def write(self, prompts: list[Answer], model, seeds: list[int]) -> list[Answer]:
        """The student's answers to these prompts, each drawn with its seed."""
        started = time.perf_counter()
        contexts = []
        for i, prompt in enumerate(prompts):
            ids = self.teacher.encode_pieces(prompt.pieces())
            if ids is None:  # a prompt the teacher cannot read exactly: the student writes from the start
                prompts[i], ids = Answer(b"", (), b"", False), np.zeros(0, dtype=np.int64)
            contexts.append(as_read(self.stream, self.teacher.layout(ids).symbols[:-1].astype(np.int64))[0].tolist())
        drawn = write_answers(
            model,
            contexts,
            [prompt.prompt for prompt in prompts],
            self.stream,
            max_bytes=self.config.max_bytes,
            temperature=self.config.temperature,
            seeds=seeds,
            never=self.never,
            stops=self.stops,
        )
        answers = [
            dataclasses.replace(answer, prompt_specials=prompt.prompt_specials, turn_end=self.turn_end(answer))
            for prompt, answer in zip(prompts, drawn)
        ]
        device = next(model.parameters()).device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        written_symbols = sum(len(a.symbols) for a in answers)
        read = sum(map(len, contexts))
        rates = self.rates()
        context = read / max(len(contexts), 1) + written_symbols / max(2 * len(contexts), 1)
        flops = read * self.cost.train_flops_per_symbol(rates, max(int(context), 1)) / 3
        flops += written_symbols * self.cost.generate_flops_per_symbol(rates, max(int(context), 1))
        self._add("write", time.perf_counter() - started, flops)
        return answers

    def turn_end(self, answer: Answer) -> int | None:
        """The teacher id of the end of turn the answer ends with (None: it does not end a turn)."""
        last = answer.symbols[-1] if answer.ended and answer.symbols else None
        return self.reserved[last - self.stream.alphabet_size] if last in self.stops else None

    def score(self, answers: list[Answer]) -> tuple[list[dict[str, np.ndarray]], list[int]]:
        """The training sequences of the answers the teacher can read exactly, and which answers they are."""
        texts, ids, kept = [], [], []
        answers = list(answers)
        for i, answer in enumerate(answers):
            readable, encoded = self.readable(answer)
            if encoded is not None:
                answers[i] = readable
                texts.append(readable.prompt + readable.text)
                ids.append(encoded)
                kept.append(i)
        dists = self.teacher.score(texts, ids) if texts else []
        times = self.teacher.take_times()
        teacher = self.teacher
        self._add(
            "teacher",
            times.forward_seconds,
            times.tokens * teacher.trunk_flops_per_token() + times.rows * teacher.head_flops_per_row(),
        )
        self._add("conversion", times.conversion_seconds, times.rows * teacher.conversion_flops_per_row())
        for dist, encoded in zip(dists, ids):
            self._symbols[0] += dist.layout.num_positions
            self._symbols[1] += dist.layout.num_text_bytes()
            self._symbols[2] += len(encoded) + 1
        for tally in (self.tally, self.total):
            tally.sequences += len(kept)
            tally.unscored += len(answers) - len(kept)
        rows = [on_policy_row(dist, answers[i], self.seq_len, self.stream) for dist, i in zip(dists, kept)]
        return rows, kept

    def readable(self, answer: Answer) -> tuple[Answer, np.ndarray | None]:
        """:func:`readable` by this run's teacher, the cut answers counted."""
        readable_answer, encoded, cut = readable(self.teacher, answer)
        if cut:
            for tally in (self.tally, self.total):
                tally.cut += 1
        return readable_answer, encoded

    def with_rows(self, batch: dict[str, torch.Tensor], rows: list[dict[str, np.ndarray]], at: list[int]) -> dict:
        """``batch`` with sequences ``at`` replaced by ``rows``, marked as the student's."""
        batch = dict(batch)
        size = len(batch["input_ids"])
        marked = torch.zeros(size, dtype=torch.bool)
        probs = torch.zeros((len(rows), self.seq_len, self.alphabet), dtype=torch.float32)
        for key in ("input_ids", "target_ids", "loss_mask", "target_probs", "roles"):
            if key in batch:
                batch[key] = batch[key].clone()
        for j, (row, r) in enumerate(zip(rows, at)):
            for key in ("input_ids", "target_ids", "loss_mask"):
                batch[key][r] = torch.from_numpy(row[key]).to(batch[key].dtype)
            if "target_probs" in batch:
                batch["target_probs"][r] = 0
            if "roles" in batch:  # what the student wrote is the assistant's
                batch["roles"][r] = torch.from_numpy(np.where(row["loss_mask"], ASSISTANT, 0)).to(batch["roles"].dtype)
            probs[j, :, : row["probs"].shape[1]] = torch.from_numpy(row["probs"])
            marked[r] = True
        batch["on_policy_rows"], batch["on_policy_probs"] = marked, probs
        return batch

    def loss(self, logits: torch.Tensor, batch: dict[str, torch.Tensor], loss: LossConfig) -> LossOutput:
        out, divergence = mixed_loss(logits, batch, loss, self.config.beta)
        for tally in (self.tally, self.total):
            tally.divergence += float(divergence)
            tally.micro_batches += 1
        return out

    # -- cost
    def rates(self) -> StreamRates:
        """Stream symbols and teacher tokens per text byte of what was scored (1 and 0.25 before any)."""
        symbols, text, tokens = self._symbols
        if not text:
            return StreamRates(1.25 if self.stream is StreamKind.EOT else 1.0, 0.25)
        return StreamRates(symbols / text, tokens / text)

    def _add(self, part: str, seconds: float, flops: float) -> None:
        for tally in (self.tally, self.total):
            tally.seconds[part] += seconds
            tally.flops[part] += flops

    @staticmethod
    def _split(tally: _Tally) -> tuple[dict[str, float], dict[str, float]]:
        """Seconds and FLOPs per step of each part (the student's: the step's time less the others)."""
        steps = max(tally.steps, 1)
        seconds = {part: tally.seconds[part] / steps for part in PARTS}
        seconds["student"] = max(tally.step_seconds / steps - sum(seconds[p] for p in PARTS[:3]), 0.0)
        return seconds, {part: tally.flops[part] / steps for part in PARTS}

    def log_values(self) -> dict[str, float]:
        """What ``train`` logs at a logging step: the parts since the previous one, then reset."""
        tally, self.tally = self.tally, _Tally()
        seconds, flops = self._split(tally)
        step = sum(seconds.values()) or 1e-12
        values = {f"on_policy/{part}_s_per_step": seconds[part] for part in PARTS}
        values |= {f"on_policy/{part}_time_share": seconds[part] / step for part in PARTS}
        values |= {f"on_policy/{part}_flops_per_step": flops[part] for part in PARTS}
        values["on_policy/divergence"] = tally.divergence / max(tally.micro_batches, 1)
        values["on_policy/sequences"] = tally.sequences
        values["on_policy/unscored"] = tally.unscored
        values["on_policy/no_turn"] = tally.no_turn
        values["on_policy/cut"] = tally.cut
        return values

    def totals(self) -> dict[str, dict[str, float] | int]:
        """Seconds and FLOPs per step of each part over the session, and the sequences written (run_info.json)."""
        seconds, flops = self._split(self.total)
        return {
            "seconds_per_step": seconds,
            "flops_per_step": flops,
            "sequences": self.total.sequences,
            "cut": self.total.cut,
            "unscored": self.total.unscored,
            "no_turn": self.total.no_turn,
        }

    def summary(self) -> str:
        """One line: each part's share of a step's time, its seconds and FLOPs per step, over the session."""
        seconds, flops = self._split(self.total)
        step = sum(seconds.values()) or 1e-12
        parts = ", ".join(
            f"{name} {seconds[part] / step:.0%} ({seconds[part]:.3g} s, {flops[part]:.3g} FLOPs)"
            for part, name in zip(PARTS, ("student writing", "teacher forward", "conversion", "student step"))
        )
        unscored = f", {self.total.cut} cut before a byte the teacher cannot read" if self.total.cut else ""
        if self.total.unscored:
            unscored += f"; {self.total.unscored} the teacher cannot read stayed offline"
        if self.total.no_turn:
            unscored += f"; {self.total.no_turn} windows with no assistant turn to write stayed offline"
        return (
            f"on-policy (lambda {self.config.share:g}, beta {self.config.beta:g}): per step {step:.3g} s: {parts}; "
            f"{self.total.sequences} sequences written{unscored}"
        )

    # -- the answers of logging steps
    def record(self, accelerator, path: Path, step: int, loss: float) -> None:
        """Append a logging step's line to ``path`` (:data:`students.training.checkpoints.ANSWERS`, main
        process): the step, its loss (the mean over processes) and the answers every process wrote in
        it, by epoch, split and window (specials as their texts)."""
        from accelerate.utils import gather_object

        written = [
            {
                "epoch": epoch,
                "split": split,
                "window": window,
                **dict(zip(("prompt", "answer"), answer.shown(self.teacher.special_text))),
                "ended": answer.ended,
            }
            for epoch, split, window, answer in self.answers
        ]
        gathered = gather_object([written]) if accelerator.num_processes > 1 else [written]
        if accelerator.is_main_process:
            answers = sorted(
                (a for part in gathered for a in part), key=lambda a: (a["epoch"], a["split"], a["window"])
            )
            append_text(path, json.dumps({"step": step, "loss": loss, "answers": answers}) + "\n")
