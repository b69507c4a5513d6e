"""On-policy training (docs/DESIGN.md, "On-policy distillation"): a share λ of each batch's
sequences is written by the student and scored exactly by the teacher.

For micro-batch n (counted over the run) the first ``⌊λ·B·(n+1)⌋ − ⌊λ·B·n⌋`` of its B sequences are
replaced, so the share is λ over any run of micro-batches and a resumed run replaces the same
ones. Each replaced window gives a prompt (:func:`students.training.on_policy_writer.prompt_of`);
the student continues it (:func:`students.training.on_policy_writer.write_answers`); the teacher
reads prompt + answer as one document, exactly as ``dump`` would
(:class:`students.training.on_policy_teacher.ScoringTeacher`), and the sequence the student then
trains on is the teacher's stream of that text: its token ends (``<eot>`` or the fused flags) are
the teacher's tokenization's, not the ones the student wrote. The loss counts the positions after
the prompt (:func:`on_policy_row`) with the divergence of
:mod:`students.training.on_policy_loss`; the other sequences keep the offline loss.

:class:`OnPolicy` owns the sampling state (saved with every checkpoint) and the cost: seconds and
FLOPs of writing, of the teacher's forward, of the conversion, and of the student's step, which
``train`` logs and prints.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from bytestream.stream_kind import StreamKind
from common.errors import UserError
from students.models.cost import StreamRates
from students.training.loss import LossConfig, LossOutput
from students.training.on_policy_config import OnPolicyConfig, check_on_policy, prompt_budget
from students.training.on_policy_loss import mixed_loss
from students.training.on_policy_writer import Answer, SamplingRng, prompt_of, write_answers

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


def rows_due(share: float, batch_size: int, micro_batch: int) -> int:
    """How many of micro-batch ``micro_batch``'s sequences the student writes."""
    due = share * batch_size
    return math.floor(due * (micro_batch + 1) + 1e-9) - math.floor(due * micro_batch + 1e-9)


def on_policy_row(
    dist: DocumentDistributions, prompt_bytes: int, ended: bool, seq_len: int, stream: StreamKind
) -> dict[str, np.ndarray]:
    """One training sequence from the teacher's conversion of prompt + answer: the teacher's stream
    as inputs and targets, its distributions as the targets' teacher, and the positions counted:
    those after the whole prompt has been read (the first predicts the answer's first byte, or a
    token end the teacher puts there), but not a final ``<eos>`` the student did not write (an
    answer cut at its byte budget has not ended). A stream longer than ``seq_len`` inputs keeps its
    last ``seq_len`` (the answer always fits: :func:`prompt_budget`)."""
    symbols = dist.layout.symbols.astype(np.int64)
    inputs, targets = symbols[:-1], symbols[1:]
    read = np.cumsum(inputs < stream.text_symbols)  # text bytes read through each input
    counted = read >= prompt_bytes
    if not ended:
        counted &= targets != stream.eos
    probs = dist.dense().astype(np.float32)
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
    encoded = teacher.encode(answer.prompt + answer.text)
    if encoded is not None:
        return answer, encoded, False
    for cut in range(len(answer.text) - 1, -1, -1):
        encoded = teacher.encode(answer.prompt + answer.text[:cut])
        if encoded is not None:
            return Answer(answer.prompt, answer.symbols, answer.text[:cut], False), encoded, True
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
        rank: int,
        device: torch.device,
        student_cost,
    ):
        if teacher.stream is not stream:
            raise UserError(f"--teacher scores the {teacher.stream.shown} stream; this student reads {stream.shown}")
        self.config, self.teacher, self.stream = config, teacher, stream
        self.seq_len, self.batch_size, self.grad_accum = seq_len, batch_size, grad_accum
        self.budget = prompt_budget(config, seq_len, stream)
        self.rank = rank
        self.rng = SamplingRng(int(np.random.SeedSequence([seed, rank]).generate_state(1)[0]), device)
        self.cost = student_cost
        absent = teacher.absent_bytes()  # symbols of bytes the teacher never reads: never drawn
        self.never = tuple(absent) + (tuple(256 + b for b in absent) if stream is StreamKind.FUSED else ())
        self.tally, self.total = _Tally(), _Tally()
        self._symbols = [0.0, 0.0, 0.0]  # stream symbols, text bytes and teacher tokens scored (rates)
        self._step_started = 0.0

    @classmethod
    def start(cls, config, accelerator, model) -> OnPolicy:
        """The on-policy part of a run (``config``: its :class:`TrainConfig`), its teacher loaded."""
        from students.models.architectures import student_cost
        from students.training.on_policy_teacher import ScoringTeacher, teacher_device

        device = teacher_device(config.on_policy.teacher_device, accelerator.device)
        teacher = ScoringTeacher.load(config.on_policy.teacher, config.train_stores[0], device)
        return cls(
            config.on_policy,
            teacher,
            stream=config.student.stream_kind,
            seq_len=config.batches.seq_len,
            batch_size=config.batches.batch_size,
            grad_accum=config.batches.grad_accum,
            seed=config.seed,
            rank=accelerator.process_index,
            device=accelerator.device,
            student_cost=student_cost(accelerator.unwrap_model(model)),
        )

    # -- a step
    def step_started(self) -> None:
        self._step_started = time.perf_counter()

    def step_finished(self, device: torch.device) -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds = time.perf_counter() - self._step_started
        for tally in (self.tally, self.total):
            tally.steps += 1
            tally.step_seconds += seconds
        sequences = self.seq_len * self.batch_size * self.grad_accum
        self._add("student", 0.0, self.cost.train_flops_per_symbol(self.rates(), self.seq_len) * sequences)

    def mix(self, batch: dict[str, torch.Tensor], model, micro_batch: int) -> dict[str, torch.Tensor]:
        """``batch`` (on the host) with its first due sequences replaced by the student's own, scored."""
        due = min(rows_due(self.config.share, self.batch_size, micro_batch), len(batch["input_ids"]))
        answers = self.write(batch["input_ids"][:due].numpy(), model) if due else []
        rows, kept = self.score(answers)
        return self.with_rows(batch, rows, kept)

    def write(self, inputs: np.ndarray, model) -> list[Answer]:
        """The student's answers to the prompts of these windows."""
        started = time.perf_counter()
        prompts, contexts = [], []
        for window in inputs:
            prompt = prompt_of(window, self.stream, self.budget)
            ids = self.teacher.encode(prompt)
            if ids is None:  # a prompt the teacher cannot read exactly: the student writes from the start
                prompt, ids = b"", np.zeros(0, dtype=np.int64)
            prompts.append(prompt)
            contexts.append(self.teacher.layout(ids).symbols[:-1].astype(np.int64).tolist())
        answers = write_answers(
            model,
            contexts,
            prompts,
            self.stream,
            max_bytes=self.config.max_bytes,
            temperature=self.config.temperature,
            rng=self.rng,
            never=self.never,
        )
        device = next(model.parameters()).device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        written = sum(len(a.symbols) for a in answers)
        read = sum(map(len, contexts))
        rates = self.rates()
        context = read / max(len(contexts), 1) + written / max(2 * len(contexts), 1)
        flops = read * self.cost.train_flops_per_symbol(rates, max(int(context), 1)) / 3
        flops += written * self.cost.generate_flops_per_symbol(rates, max(int(context), 1))
        self._add("write", time.perf_counter() - started, flops)
        return answers

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
        rows = [
            on_policy_row(dist, len(answers[i].prompt), answers[i].ended, self.seq_len, self.stream)
            for dist, i in zip(dists, kept)
        ]
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
        probs = torch.zeros((len(rows), self.seq_len, self.stream.alphabet_size), dtype=torch.float32)
        for key in ("input_ids", "target_ids", "loss_mask"):
            batch[key] = batch[key].clone()
        if "target_probs" in batch:
            batch["target_probs"] = batch["target_probs"].clone()
        for j, (row, r) in enumerate(zip(rows, at)):
            for key in ("input_ids", "target_ids", "loss_mask"):
                batch[key][r] = torch.from_numpy(row[key]).to(batch[key].dtype)
            if "target_probs" in batch:
                batch["target_probs"][r] = 0
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
        return (
            f"on-policy (lambda {self.config.share:g}, beta {self.config.beta:g}): per step {step:.3g} s: {parts}; "
            f"{self.total.sequences} sequences written{unscored}"
        )

    # -- checkpoints
    def save(self, folder: Path) -> None:
        self.rng.save(folder, self.rank)

    def load(self, folder: Path) -> None:
        """The sampling state ``folder`` saved (a checkpoint of an offline run has none: the seeded one stays)."""
        self.rng.load(folder, self.rank)
