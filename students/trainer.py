"""Train a byte student on logit stores (issue 5).

One loop for one CPU, one GPU or many (``accelerate launch``: DDP, or FSDP via an accelerate
config). Each rank reads its own slice of the packed streams (the dataset takes ``rank`` and
``world_size``; the loader is not re-sharded by accelerate). Optimiser: AdamW; learning rate:
linear warm-up times a cosine decay to ``min_lr`` over the run's progress (steps or training
bytes, whichever limit is nearer), computed from the step and byte counters so that a resumed run
needs no scheduler state.

Output directory::

    metrics.jsonl                 one line per evaluation (step, train_bytes, student_bpb, ...)
    run_info.json                 config, teacher/data description, bytes, latest evaluation
    logs/                         TensorBoard (and wandb when asked for)
    checkpoints/step-00001000/    accelerate state (model.safetensors, optimizer, RNG),
                                  config.json, data_position_rank*.json, run_info.json,
                                  trainer_state.json (written last: marks the checkpoint complete)

A resumed run (``resume="latest"`` or a checkpoint path) restores weights, optimiser, RNG and
every rank's data position (epoch, batches consumed), and continues exactly as if never stopped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from distill.alphabet import NUM_BYTES
from distill.errors import UserError
from students.loss import distill_loss, kl_per_position
from students.model import PRESETS, build_student, count_parameters, student_config


@dataclass
class TrainConfig:
    train_stores: list[str] = field(metadata={"help": "logit store directories to train on"})
    output_dir: str = field(metadata={"help": "directory for checkpoints, metrics.jsonl, run_info.json and logs"})
    eval_store: str | None = field(default=None, metadata={"help": "held-out logit store for periodic evaluation"})
    # student
    preset: str = field(default="small", metadata={"help": "student size preset", "choices": list(PRESETS)})
    hidden_size: int | None = field(default=None, metadata={"help": "override the preset's hidden size"})
    num_layers: int | None = field(default=None, metadata={"help": "override the preset's number of layers"})
    num_heads: int | None = field(default=None, metadata={"help": "override the preset's attention heads"})
    num_kv_heads: int | None = field(default=None, metadata={"help": "key/value heads (grouped-query attention)"})
    intermediate_size: int | None = field(default=None, metadata={"help": "override the preset's MLP width"})
    max_positions: int | None = field(default=None, metadata={"help": "model's maximum positions (default: seq_len)"})
    rope_theta: float = field(default=10000.0, metadata={"help": "rotary embedding base"})
    # data and batch
    seq_len: int = field(default=512, metadata={"help": "symbols per training sequence"})
    batch_size: int = field(default=16, metadata={"help": "sequences per micro-batch per process"})
    grad_accum: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    num_workers: int = field(default=0, metadata={"help": "data loader worker processes"})
    # optimisation
    lr: float = field(default=1e-3, metadata={"help": "peak learning rate"})
    min_lr: float = field(default=1e-4, metadata={"help": "learning rate at the end of the cosine decay"})
    warmup_steps: int = field(default=100, metadata={"help": "linear warm-up steps"})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW weight decay (matrices only)"})
    grad_clip: float = field(default=1.0, metadata={"help": "clip the gradient norm to this (0: off)"})
    max_steps: int | None = field(default=None, metadata={"help": "stop after this many optimizer steps"})
    max_train_bytes: int | None = field(default=None, metadata={"help": "stop after this many UTF-8 training bytes"})
    stop_at_step: int | None = field(
        default=None,
        metadata={"help": "end this session at this step with a checkpoint (schedule unchanged); resume later"},
    )
    # loss
    alpha: float = field(default=1.0, metadata={"help": "weight of KL(teacher||student); 1-alpha weighs cross-entropy; 0 = baseline"})
    temperature: float = field(default=1.0, metadata={"help": "distillation temperature"})
    # evaluation, checkpoints, logs
    eval_every: int = field(default=500, metadata={"help": "evaluate every N steps (0: only at start and end)"})
    eval_bytes: int = field(default=1_000_000, metadata={"help": "UTF-8 bytes of the held-out store per evaluation (0: all)"})
    checkpoint_every: int = field(default=1000, metadata={"help": "save a checkpoint every N steps (0: only at the end)"})
    keep_checkpoints: int = field(default=3, metadata={"help": "keep only the newest N checkpoints (0: keep all)"})
    log_every: int = field(default=10, metadata={"help": "log training loss every N steps"})
    log_dir: str | None = field(default=None, metadata={"help": "TensorBoard directory (default: OUTPUT_DIR/logs)"})
    wandb_project: str | None = field(default=None, metadata={"help": "also log to this wandb project (needs wandb)"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})
    # run
    seed: int = field(default=0, metadata={"help": "seed for initialisation and data order"})
    mixed_precision: str = field(
        default="no", metadata={"help": "mixed precision", "choices": ["no", "fp16", "bf16"]}
    )
    resume: str | None = field(
        default=None, metadata={"help": "'latest' (newest checkpoint in OUTPUT_DIR, if any) or a checkpoint directory"}
    )

    def __post_init__(self) -> None:
        if isinstance(self.train_stores, str):
            self.train_stores = [self.train_stores]
        if not self.train_stores:
            raise UserError("train: give at least one --train-stores directory")
        if self.max_steps is None and self.max_train_bytes is None:
            raise UserError("train: give --max-steps or --max-train-bytes")
        for name in ("seq_len", "batch_size", "grad_accum", "log_every"):
            if getattr(self, name) < 1:
                raise UserError(f"train: --{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")


# ---------------------------------------------------------------------------------------- data


@dataclass
class DataSource:
    """Where batches come from: the logit stores by default; tests plug in synthetic data.

    ``build(paths, seq_len, *, with_teacher, shuffle, seed, rank, world_size)`` returns an
    IterableDataset with ``set_epoch`` yielding dicts of ``input_ids``, ``target_ids``,
    ``loss_mask`` and (with a teacher) ``target_probs``; ``describe(paths)`` returns what the
    model card says about the teacher and data.
    """

    build: Callable[..., IterableDataset]
    describe: Callable[[list[str]], dict[str, Any]]


def _store_dataset(paths: list[str], seq_len: int, **kwargs: Any) -> IterableDataset:
    from logit_store.dataset import PackedStreamDataset

    return PackedStreamDataset([Path(p) for p in paths], seq_len, **kwargs)


def _describe_stores(paths: list[str]) -> dict[str, Any]:
    """Teacher and data as recorded in the stores' manifests (for run_info.json and the model card)."""
    from logit_store.store import read_manifest

    manifest = read_manifest(Path(paths[0]))
    return {
        "teacher": manifest.get("teacher") or "unknown",
        "corpus": ", ".join(Path(p).name for p in paths),
        "corpus_hash": manifest.get("corpus_hash"),
        "encoding": manifest.get("encoding"),
    }


STORE_SOURCE = DataSource(build=_store_dataset, describe=_describe_stores)


class BatchStream:
    """Endless micro-batches over epochs, remembering (epoch, batches consumed in the epoch)."""

    def __init__(self, dataset: IterableDataset, batch_size: int, num_workers: int, epoch: int = 0, batches: int = 0):
        self.dataset, self.batch_size, self.num_workers = dataset, batch_size, num_workers
        self.epoch, self.batches = epoch, batches
        self._iterator: Iterator | None = None

    def _start_epoch(self) -> None:
        self.dataset.set_epoch(self.epoch)
        loader = DataLoader(self.dataset, batch_size=self.batch_size, num_workers=self.num_workers)
        self._iterator = iter(loader)
        for _ in range(self.batches):  # resume: skip what this epoch already gave
            if next(self._iterator, None) is None:
                raise UserError(f"cannot resume: epoch {self.epoch} has fewer than {self.batches} batches")

    def __next__(self) -> dict[str, torch.Tensor]:
        for _ in range(2):
            if self._iterator is None:
                self._start_epoch()
            batch = next(self._iterator, None)
            if batch is not None:
                self.batches += 1
                return batch
            self._iterator, self.epoch, self.batches = None, self.epoch + 1, 0
        raise UserError("the training stores yield no batch (are they empty?)")

    def position(self) -> dict[str, int]:
        return {"epoch": self.epoch, "batches": self.batches}


def utf8_bytes(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Target positions that are real bytes: the BPB denominator and the training-bytes counter."""
    return (batch["loss_mask"].bool() & (batch["target_ids"] < NUM_BYTES)).sum()


# ---------------------------------------------------------------------------------- schedule


def learning_rate(config: TrainConfig, step: int, progress: float) -> float:
    """Linear warm-up over ``warmup_steps`` times a cosine from ``lr`` to ``min_lr`` over progress 0..1."""
    warmup = min(1.0, step / config.warmup_steps) if config.warmup_steps > 0 else 1.0
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return warmup * (config.min_lr + (config.lr - config.min_lr) * cosine)


def progress(config: TrainConfig, step: int, train_bytes: int) -> float:
    """Fraction of the run done: the nearer of the step and byte limits."""
    fractions = []
    if config.max_steps:
        fractions.append(step / config.max_steps)
    if config.max_train_bytes:
        fractions.append(train_bytes / config.max_train_bytes)
    return max(fractions) if fractions else 1.0


def _optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95), eps=1e-8)


# -------------------------------------------------------------------------------- evaluation


@dataclass
class EvalMetrics:
    student_bpb: float
    teacher_bpb: float
    kl_per_byte: float  # KL(teacher ‖ student) summed over the stream, in bits per UTF-8 byte
    eval_bytes: int


@torch.no_grad()
def evaluate(model, accelerator, dataset: IterableDataset, batch_size: int, max_bytes: int = 0) -> EvalMetrics:
    """Student and teacher BPB and KL per byte on a held-out stream (docs/DESIGN.md, "Evaluation").

    All ranks step together and stop when any runs out or ``max_bytes`` is reached.
    """
    was_training = model.training
    model.eval()
    sums = torch.zeros(4, dtype=torch.float64, device=accelerator.device)  # student nll, teacher nll, kl, bytes
    batches = iter(DataLoader(dataset, batch_size=batch_size))
    while True:
        batch = next(batches, None)
        have = torch.tensor([1.0 if batch is not None else 0.0], device=accelerator.device)
        if accelerator.gather(have).min() == 0:
            break
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        logprobs = torch.log_softmax(model(input_ids=batch["input_ids"], use_cache=False).logits.float(), -1)
        mask = batch["loss_mask"].bool()
        targets = batch["target_ids"].long().unsqueeze(-1)
        probs = batch["target_probs"].float()
        student_nll = -logprobs.gather(-1, targets).squeeze(-1)
        teacher_nll = -probs.gather(-1, targets).squeeze(-1).double().log()
        kl = kl_per_position(probs, logprobs)
        local = torch.stack(
            [student_nll[mask].double().sum(), teacher_nll[mask].sum(), kl[mask].double().sum(), utf8_bytes(batch).double()]
        )
        sums += accelerator.reduce(local, reduction="sum")
        if max_bytes and sums[3] >= max_bytes:
            break
    model.train(was_training)
    student, teacher, kl_sum, n_bytes = sums.tolist()
    if n_bytes == 0:
        raise UserError("the evaluation store yields no UTF-8 bytes")
    scale = math.log(2) * n_bytes
    return EvalMetrics(student / scale, teacher / scale, kl_sum / scale, int(n_bytes))


# ------------------------------------------------------------------------------- checkpoints


@dataclass
class TrainerState:
    step: int = 0
    train_bytes: int = 0
    last_eval: dict[str, Any] | None = None


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    return output_dir / "checkpoints" / f"step-{step:08d}"


def latest_checkpoint(output_dir: Path) -> Path | None:
    """The newest complete checkpoint (one with trainer_state.json) under ``output_dir``."""
    complete = sorted((output_dir / "checkpoints").glob("step-*/trainer_state.json"))
    return complete[-1].parent if complete else None


def _resolve_resume(config: TrainConfig) -> Path | None:
    if config.resume is None:
        return None
    if config.resume == "latest":
        return latest_checkpoint(Path(config.output_dir))
    path = Path(config.resume)
    if not (path / "trainer_state.json").is_file():
        raise UserError(f"cannot resume: {path} is not a complete checkpoint (no trainer_state.json)")
    return path


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def save_checkpoint(accelerator, model, path: Path, state: TrainerState, stream: BatchStream, run_info: dict) -> None:
    """Everything needed to continue exactly; trainer_state.json goes last."""
    accelerator.save_state(str(path), safe_serialization=True)
    _write_json(path / f"data_position_rank{accelerator.process_index}.json", stream.position())
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        accelerator.unwrap_model(model).config.to_json_file(path / "config.json")
        _write_json(path / "run_info.json", run_info)
        _write_json(path / "trainer_state.json", dataclasses.asdict(state))
    accelerator.wait_for_everyone()


def _prune_checkpoints(output_dir: Path, keep: int) -> None:
    if keep <= 0:
        return
    complete = sorted(p.parent for p in (output_dir / "checkpoints").glob("step-*/trainer_state.json"))
    for old in complete[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(accelerator, path: Path) -> tuple[TrainerState, dict[str, int]]:
    accelerator.load_state(str(path))
    state = TrainerState(**json.loads((path / "trainer_state.json").read_text(encoding="utf-8")))
    position_file = path / f"data_position_rank{accelerator.process_index}.json"
    if not position_file.is_file():
        raise UserError(f"cannot resume: {position_file} is missing (was the run started with another number of processes?)")
    return state, json.loads(position_file.read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------ the run


@dataclass
class TrainResult:
    step: int
    train_bytes: int
    losses: dict[int, float]  # optimizer step -> this process's mean loss, for the steps of this session
    last_eval: dict[str, Any] | None
    checkpoint: Path | None


def _accelerator(config: TrainConfig, log_dir: Path):
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, is_wandb_available

    trackers = ["tensorboard"]
    if config.wandb_project:
        if not is_wandb_available():
            raise UserError("--wandb-project needs wandb installed (pip install wandb)")
        trackers.append("wandb")
    return Accelerator(
        mixed_precision=config.mixed_precision,
        gradient_accumulation_steps=config.grad_accum,
        log_with=trackers,
        project_config=ProjectConfiguration(project_dir=str(config.output_dir), logging_dir=str(log_dir)),
    )


def _hparams(config: TrainConfig) -> dict[str, Any]:
    """The config in the scalar types TensorBoard's hparams accept."""
    out = {}
    for key, value in dataclasses.asdict(config).items():
        out[key] = value if isinstance(value, (int, float, str, bool)) else json.dumps(value)
    return out


def _model(config: TrainConfig):
    model_config = student_config(
        config.preset,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        num_heads=config.num_heads,
        num_kv_heads=config.num_kv_heads,
        intermediate_size=config.intermediate_size,
        max_positions=config.max_positions or config.seq_len,
        rope_theta=config.rope_theta,
    )
    return build_student(model_config, seed=config.seed)


def _done(config: TrainConfig, state: TrainerState) -> bool:
    return bool(
        (config.max_steps and state.step >= config.max_steps)
        or (config.max_train_bytes and state.train_bytes >= config.max_train_bytes)
    )


def _append_metrics(path: Path, record: dict[str, Any]) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record) + "\n")


def train(config: TrainConfig, source: DataSource = STORE_SOURCE) -> TrainResult:
    """Train (or resume) a student as ``config`` says; returns where it ended."""
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    log_dir = Path(config.log_dir) if config.log_dir else output_dir / "logs"
    accelerator = _accelerator(config, log_dir)
    set_seed(config.seed)
    model = _model(config)
    optimizer = _optimizer(model, config)
    model, optimizer = accelerator.prepare(model, optimizer)
    rank, world = accelerator.process_index, accelerator.num_processes
    with_teacher = config.alpha > 0

    state, position = TrainerState(), {"epoch": 0, "batches": 0}
    resume_from = _resolve_resume(config)
    if resume_from is not None:
        state, position = load_checkpoint(accelerator, resume_from)
    dataset = source.build(
        config.train_stores, config.seq_len, with_teacher=with_teacher, shuffle=True, seed=config.seed, rank=rank, world_size=world
    )
    stream = BatchStream(dataset, config.batch_size, config.num_workers, **position)

    def run_info() -> dict[str, Any]:
        return {
            "config": dataclasses.asdict(config),
            "data": source.describe(config.train_stores),
            "parameters": count_parameters(accelerator.unwrap_model(model)),
            **dataclasses.asdict(state),
        }

    def run_eval() -> None:
        if config.eval_store is None:
            return
        eval_set = source.build(
            [config.eval_store], config.seq_len, with_teacher=True, shuffle=False, seed=0, rank=rank, world_size=world
        )
        metrics = evaluate(model, accelerator, eval_set, config.batch_size, config.eval_bytes)
        state.last_eval = {"step": state.step, "train_bytes": state.train_bytes, **dataclasses.asdict(metrics)}
        accelerator.log({f"eval/{k}": v for k, v in dataclasses.asdict(metrics).items()}, step=state.step)
        if accelerator.is_main_process:
            _append_metrics(output_dir / "metrics.jsonl", state.last_eval)
            bar.write(
                f"eval step {state.step}: student {metrics.student_bpb:.4f} bpb, teacher {metrics.teacher_bpb:.4f} bpb, "
                f"KL {metrics.kl_per_byte:.4f} bits/byte"
            )

    def checkpoint() -> Path:
        path = checkpoint_dir(output_dir, state.step)
        save_checkpoint(accelerator, model, path, state, stream, run_info())
        if accelerator.is_main_process:
            _prune_checkpoints(output_dir, config.keep_checkpoints)
        return path

    accelerator.init_trackers("bytedistill", config=_hparams(config))
    bar = tqdm(
        total=config.max_steps, initial=state.step, disable=not (config.progress and accelerator.is_main_process),
        unit="step", dynamic_ncols=True,
    )
    if resume_from is None:
        run_eval()
    losses: dict[int, float] = {}
    last_checkpoint, stopped_early = None, False
    window_start, window_bytes = time.perf_counter(), 0
    model.train()
    while not _done(config, state):
        state.step += 1
        lr = learning_rate(config, state.step, progress(config, state.step - 1, state.train_bytes))
        for group in optimizer.param_groups:
            group["lr"] = lr
        sums = torch.zeros(4, device=accelerator.device)  # total, kl, ce, bytes
        for _ in range(config.grad_accum):
            batch = {k: v.to(accelerator.device) for k, v in next(stream).items()}
            with accelerator.accumulate(model):
                logits = model(input_ids=batch["input_ids"], use_cache=False).logits
                out = distill_loss(
                    logits, batch["target_ids"], batch["loss_mask"], batch.get("target_probs"),
                    alpha=config.alpha, temperature=config.temperature,
                )
                accelerator.backward(out.total)
                if accelerator.sync_gradients and config.grad_clip > 0:
                    accelerator.clip_grad_norm_(model.parameters(), config.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            sums += torch.stack([out.total.detach(), out.kl.detach(), out.ce.detach(), utf8_bytes(batch).float()])
        step_bytes = int(accelerator.reduce(sums[3:4].clone(), reduction="sum").item())
        state.train_bytes += step_bytes
        window_bytes += step_bytes
        mean = sums[:3] / config.grad_accum
        losses[state.step] = float(mean[0])
        bar.update(1)

        if state.step % config.log_every == 0:
            mean = accelerator.reduce(mean, reduction="mean")
            rate = window_bytes / max(time.perf_counter() - window_start, 1e-9)
            window_start, window_bytes = time.perf_counter(), 0
            values = {"train/loss": float(mean[0]), "train/ce": float(mean[2]), "train/lr": lr,
                      "train/bytes": state.train_bytes, "train/bytes_per_s": rate}
            if with_teacher:
                values["train/kl"] = float(mean[1])
            accelerator.log(values, step=state.step)
            bar.set_postfix(loss=f"{float(mean[0]):.4f}", bytes_s=f"{rate:,.0f}")
        if config.eval_every and state.step % config.eval_every == 0:
            run_eval()
        if config.checkpoint_every and state.step % config.checkpoint_every == 0:
            last_checkpoint = checkpoint()
        if config.stop_at_step is not None and state.step >= config.stop_at_step and not _done(config, state):
            stopped_early = True
            break

    if not stopped_early and (state.last_eval is None or state.last_eval["step"] != state.step):
        run_eval()
    if last_checkpoint is None or last_checkpoint != checkpoint_dir(output_dir, state.step):
        last_checkpoint = checkpoint()
    if accelerator.is_main_process:
        _write_json(output_dir / "run_info.json", {**run_info(), "checkpoint": str(last_checkpoint)})
    bar.close()
    accelerator.end_training()
    return TrainResult(state.step, state.train_bytes, losses, state.last_eval, last_checkpoint)
