"""Train a byte student on logit stores.

One loop for one CPU, one GPU or many (``accelerate launch``: DDP, or FSDP via an accelerate
config); ``train`` reads top to bottom: start (or resume) a run, then train steps, evaluations
and checkpoints until a limit, then finish. Each rank reads its own splits of the stores
(:mod:`logit_store.dataset`; the loader is not re-sharded by accelerate). Optimiser: AdamW;
learning rate: linear warm-up times a cosine decay to ``min_lr`` over the run's progress (steps or
training bytes, whichever limit is nearer), computed from the step and byte counters so that a
resumed run needs no scheduler state. With ``mixed_precision`` the forward runs under autocast;
the loss is computed in float32.

Output directory::

    metrics.jsonl                 one line per evaluation (step, train_bytes, student_bpb, ...)
    run_info.json                 config, teacher/data description, bytes, latest evaluation
    logs/                         TensorBoard (and wandb when asked for)
    checkpoints/step-00001000/    see :mod:`students.checkpoints`

A resumed run (``resume="latest"`` or a checkpoint path) restores weights, optimiser, RNG and
every rank's data position and seeks there (:mod:`students.data`), so it continues exactly as if
never stopped; evaluation records after the checkpoint's step are dropped from metrics.jsonl.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from distill.errors import UserError
from logit_store.dataset import SplitBatches
from students.architectures import ARCHITECTURES, build_from_train_config, require_architecture
from students.checkpoints import (
    TrainerState,
    checkpoint_dir,
    keep_metrics_until,
    load_checkpoint,
    prune_checkpoints,
    resolve_resume,
    save_checkpoint,
    write_json,
)
from students.cost import StreamRates, student_cost, summary_line
from students.data import STORE_SOURCE, BatchStream, DataSource, to_device, utf8_bytes
from students.evaluation import EvalMetrics, evaluate
from students.loss import distill_loss
from students.model import PRESETS, count_parameters


@dataclass
class TrainConfig:
    train_stores: list[str] = field(metadata={"help": "logit store directories to train on"})
    output_dir: str = field(metadata={"help": "directory for checkpoints, metrics.jsonl, run_info.json and logs"})
    eval_store: str | None = field(default=None, metadata={"help": "held-out logit store for periodic evaluation"})
    # student
    architecture: str = field(
        default="flat",
        metadata={
            "help": "flat: a Llama over symbols; patched: a global model over the teacher's tokens with a local "
            "byte encoder and decoder",
            "choices": list(ARCHITECTURES),
        },
    )
    preset: str = field(default="small", metadata={"help": "student size preset", "choices": list(PRESETS)})
    hidden_size: int | None = field(default=None, metadata={"help": "override the preset's hidden size"})
    num_layers: int | None = field(default=None, metadata={"help": "override the preset's number of layers"})
    num_heads: int | None = field(default=None, metadata={"help": "override the preset's attention heads"})
    num_kv_heads: int | None = field(default=None, metadata={"help": "key/value heads (grouped-query attention)"})
    intermediate_size: int | None = field(default=None, metadata={"help": "override the preset's MLP width"})
    max_positions: int | None = field(default=None, metadata={"help": "model's maximum positions (default: seq_len)"})
    rope_theta: float = field(default=10000.0, metadata={"help": "rotary embedding base"})
    local_hidden_size: int | None = field(default=None, metadata={"help": "patched: the local layers' width"})
    local_layers: int | None = field(default=None, metadata={"help": "patched: local encoder (= decoder) layers"})
    local_window: int | None = field(default=None, metadata={"help": "patched: symbols a local layer attends to"})
    # data and batch
    seq_len: int = field(default=512, metadata={"help": "symbols per training sequence"})
    batch_size: int = field(default=16, metadata={"help": "sequences per micro-batch per process"})
    grad_accum: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    num_workers: int = field(
        default=0, metadata={"help": "data loader worker processes per process (decode the store in parallel)"}
    )
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
    alpha: float = field(
        default=1.0, metadata={"help": "weight of KL(teacher||student); 1-alpha weighs cross-entropy; 0 = baseline"}
    )
    temperature: float = field(default=1.0, metadata={"help": "distillation temperature"})
    # evaluation, checkpoints, logs
    eval_every: int = field(default=500, metadata={"help": "evaluate every N steps (0: only at start and end)"})
    eval_bytes: int = field(
        default=1_000_000,
        metadata={
            "help": "evaluate on the held-out documents, in store order, "
            "until their streams reach about this many symbols (0: all)"
        },
    )
    checkpoint_every: int = field(
        default=1000, metadata={"help": "save a checkpoint every N steps (0: only at the end)"}
    )
    keep_checkpoints: int = field(default=3, metadata={"help": "keep only the newest N checkpoints (0: keep all)"})
    log_every: int = field(default=10, metadata={"help": "log training loss every N steps"})
    log_dir: str | None = field(default=None, metadata={"help": "TensorBoard directory (default: OUTPUT_DIR/logs)"})
    wandb_project: str | None = field(default=None, metadata={"help": "also log to this wandb project (needs wandb)"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})
    # run
    seed: int = field(default=0, metadata={"help": "seed for initialisation and data order"})
    mixed_precision: str = field(default="no", metadata={"help": "mixed precision", "choices": ["no", "fp16", "bf16"]})
    resume: str | None = field(
        default=None, metadata={"help": "'latest' (newest checkpoint in OUTPUT_DIR, if any) or a checkpoint directory"}
    )

    def __post_init__(self) -> None:
        if isinstance(self.train_stores, str):
            self.train_stores = [self.train_stores]
        if not self.train_stores:
            raise UserError("give at least one --train-stores directory")
        if self.max_steps is None and self.max_train_bytes is None:
            raise UserError("give --max-steps or --max-train-bytes")
        for name in ("seq_len", "batch_size", "grad_accum", "log_every", "max_steps", "max_train_bytes"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")


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


@dataclass
class Run:
    """What a training session holds between its steps."""

    config: TrainConfig
    accelerator: Any
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    stream: BatchStream
    eval_set: SplitBatches | None
    data: dict[str, Any]  # teacher and data, as the stores describe them
    state: TrainerState
    bar: Any  # tqdm
    losses: dict[int, float] = field(default_factory=dict)  # step -> this process's mean loss
    window: tuple[float, int] = (0.0, 0)  # throughput window: start time, bytes since

    @property
    def output_dir(self) -> Path:
        return Path(self.config.output_dir)


@dataclass
class StepStats:
    """One optimizer step: its learning rate and mean losses over its micro-batches (this process)."""

    lr: float
    losses: dict[str, torch.Tensor]  # total, kl, ce


@dataclass
class TrainResult:
    step: int
    train_bytes: int
    losses: dict[int, float]  # optimizer step -> this process's mean loss, for the steps of this session
    last_eval: dict[str, Any] | None
    checkpoint: Path | None


def train(config: TrainConfig, source: DataSource = STORE_SOURCE) -> TrainResult:
    """Train (or resume) a student as ``config`` says; returns where it ended."""
    run, resumed = start_run(config, source)
    if not resumed:
        evaluate_and_record(run)
    last_checkpoint = None
    while not _done(config, run.state):
        stats = train_step(run)
        step = run.state.step
        if step % config.log_every == 0:
            log_training(run, stats)
        if config.eval_every and step % config.eval_every == 0:
            evaluate_and_record(run)
        if config.checkpoint_every and step % config.checkpoint_every == 0:
            last_checkpoint = save(run)
        if config.stop_at_step is not None and step >= config.stop_at_step and not _done(config, run.state):
            break
    if _done(config, run.state) and (run.state.last_eval is None or run.state.last_eval["step"] != run.state.step):
        evaluate_and_record(run)
    if last_checkpoint != checkpoint_dir(run.output_dir, run.state.step):
        last_checkpoint = save(run)
    return finish(run, last_checkpoint)


def require_one_teacher(train_set: Any, eval_set: Any, eval_store: str) -> None:
    """Refuse a held-out store of another vocabulary: its ``<eot>`` marks and distributions are another teacher's."""
    train_hash = getattr(getattr(train_set, "store", None), "vocab_hash", None)
    eval_hash = getattr(getattr(eval_set, "store", None), "vocab_hash", None)
    if train_hash and eval_hash and train_hash != eval_hash:
        raise UserError(
            f"--eval-store {eval_store} was dumped with another vocabulary than --train-stores "
            f"({eval_hash[:12]}… vs {train_hash[:12]}…): give a held-out store of the same teacher"
        )


def start_run(config: TrainConfig, source: DataSource) -> tuple[Run, bool]:
    """Accelerator, model, optimiser and data, restored from a checkpoint when resuming."""
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    accelerator = _accelerator(config, Path(config.log_dir) if config.log_dir else output_dir / "logs")
    set_seed(config.seed)
    model, optimizer = accelerator.prepare(*_model_and_optimizer(config))
    common = {
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "num_workers": config.num_workers,
    }
    train_set = source.build(
        config.train_stores,
        config.seq_len,
        config.batch_size,
        with_teacher=config.alpha > 0,
        teacher_dtype="float16",
        shuffle=True,
        seed=config.seed,
        max_symbols=0,
        **common,
    )
    eval_set = None
    if config.eval_store is not None:
        eval_set = source.build(
            [config.eval_store],
            config.seq_len,
            config.batch_size,
            with_teacher=True,
            teacher_dtype="float32",
            shuffle=False,
            seed=0,
            max_symbols=config.eval_bytes,
            **common,
        )
        require_one_teacher(train_set, eval_set, config.eval_store)
    state, position = TrainerState(), {"epoch": 0, "batches": 0}
    resume_from = resolve_resume(config.resume, output_dir)
    if resume_from is not None:
        require_architecture(resume_from, config.architecture)
        state, position = load_checkpoint(accelerator, resume_from, train_set.order_settings())
        if accelerator.is_main_process:
            keep_metrics_until(output_dir / "metrics.jsonl", state.step)
    accelerator.init_trackers("bytedistill", config=_hparams(config))
    data = source.describe(config.train_stores)
    accelerator.print(summary_line(student_cost(accelerator.unwrap_model(model)), _rates(data), config.seq_len))
    bar = tqdm(
        total=config.max_steps,
        initial=state.step,
        disable=not (config.progress and accelerator.is_main_process),
        unit="step",
        dynamic_ncols=True,
    )
    run = Run(
        config,
        accelerator,
        model,
        optimizer,
        BatchStream(train_set, **position),
        eval_set,
        data,
        state,
        bar,
        window=(time.perf_counter(), 0),
    )
    model.train()
    return run, resume_from is not None


def train_step(run: Run) -> StepStats:
    """One optimizer step over ``grad_accum`` micro-batches; advances the step and byte counters."""
    config, accelerator, model, optimizer, state = run.config, run.accelerator, run.model, run.optimizer, run.state
    lr = learning_rate(config, state.step + 1, progress(config, state.step, state.train_bytes))
    for group in optimizer.param_groups:
        group["lr"] = lr
    sums = {name: torch.zeros((), device=accelerator.device) for name in ("total", "kl", "ce")}
    step_bytes = torch.zeros((), dtype=torch.int64, device=accelerator.device)
    for _ in range(config.grad_accum):
        batch = to_device(next(run.stream), accelerator.device)
        with accelerator.accumulate(model):
            logits = model(input_ids=batch["input_ids"], use_cache=False).logits
            out = distill_loss(
                logits,
                batch["target_ids"],
                batch["loss_mask"],
                batch.get("target_probs"),
                alpha=config.alpha,
                temperature=config.temperature,
            )
            accelerator.backward(out.total)
            if accelerator.sync_gradients and config.grad_clip > 0:
                accelerator.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for name in sums:
            sums[name] += getattr(out, name).detach()
        step_bytes += utf8_bytes(batch)
    added = int(accelerator.reduce(step_bytes, reduction="sum"))
    state.step += 1
    state.train_bytes += added
    run.window = (run.window[0], run.window[1] + added)
    losses = {name: value / config.grad_accum for name, value in sums.items()}
    run.losses[state.step] = float(losses["total"])
    run.bar.update(1)
    return StepStats(lr, losses)


def log_training(run: Run, stats: StepStats) -> None:
    """Losses (mean over processes), learning rate and throughput since the last log."""
    mean = run.accelerator.reduce(stats.losses, reduction="mean")
    start, window_bytes = run.window
    rate = window_bytes / max(time.perf_counter() - start, 1e-9)
    run.window = (time.perf_counter(), 0)
    values = {
        "train/loss": float(mean["total"]),
        "train/ce": float(mean["ce"]),
        "train/lr": stats.lr,
        "train/bytes": run.state.train_bytes,
        "train/bytes_per_s": rate,
    }
    if run.config.alpha > 0:
        values["train/kl"] = float(mean["kl"])
    run.accelerator.log(values, step=run.state.step)
    run.bar.set_postfix(loss=f"{float(mean['total']):.4f}", bytes_s=f"{rate:,.0f}")


def evaluate_and_record(run: Run) -> EvalMetrics | None:
    """Evaluate on the held-out store (if any); log, append to metrics.jsonl, remember as last_eval."""
    if run.eval_set is None:
        return None
    metrics = evaluate(run.model, run.accelerator, run.eval_set, run.config.seq_len)
    state = run.state
    state.last_eval = {"step": state.step, "train_bytes": state.train_bytes, **dataclasses.asdict(metrics)}
    run.accelerator.log({f"eval/{k}": v for k, v in dataclasses.asdict(metrics).items()}, step=state.step)
    if run.accelerator.is_main_process:
        with (run.output_dir / "metrics.jsonl").open("a", encoding="utf-8") as f:
            f.write(json.dumps(state.last_eval) + "\n")
        run.bar.write(
            f"eval step {state.step}: student {metrics.student_bpb:.4f} bpb, teacher {metrics.teacher_bpb:.4f} bpb, "
            f"KL {metrics.kl_per_byte:.4f} bits/byte"
        )
    return metrics


def save(run: Run) -> Path:
    """A checkpoint of the current step; older ones beyond ``keep_checkpoints`` are removed."""
    path = checkpoint_dir(run.output_dir, run.state.step)
    save_checkpoint(
        run.accelerator,
        run.model,
        path,
        run.state,
        run.stream.position(),
        run.stream.dataset.order_settings(),
        run_info(run),
    )
    if run.accelerator.is_main_process:
        prune_checkpoints(run.output_dir, run.config.keep_checkpoints)
    return path


def finish(run: Run, last_checkpoint: Path) -> TrainResult:
    if run.accelerator.is_main_process:
        write_json(run.output_dir / "run_info.json", {**run_info(run), "checkpoint": str(last_checkpoint)})
    run.bar.close()
    run.accelerator.end_training()
    state = run.state
    return TrainResult(state.step, state.train_bytes, run.losses, state.last_eval, last_checkpoint)


def run_info(run: Run) -> dict[str, Any]:
    model = run.accelerator.unwrap_model(run.model)
    return {
        "config": dataclasses.asdict(run.config),
        "data": run.data,
        "parameters": count_parameters(model),
        "student": dataclasses.asdict(student_cost(model)),
        **dataclasses.asdict(run.state),
    }


def _rates(data: dict[str, Any]) -> StreamRates | None:
    """The data's symbols and patches per byte, when its description has them."""
    rates = data.get("rates")
    return StreamRates(**rates) if rates else None


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
    return {
        k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v) for k, v in dataclasses.asdict(config).items()
    }


def _model_and_optimizer(config: TrainConfig) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = build_from_train_config(config)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return model, torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95), eps=1e-8)


def _done(config: TrainConfig, state: TrainerState) -> bool:
    return bool(
        (config.max_steps and state.step >= config.max_steps)
        or (config.max_train_bytes and state.train_bytes >= config.max_train_bytes)
    )
