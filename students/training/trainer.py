"""Train a byte student on logit stores.

One loop for one CPU, one GPU or many (``accelerate launch``: DDP, or FSDP via an accelerate
config); ``train`` reads top to bottom: start (or resume) a run, then train steps, evaluations
and checkpoints until a limit, then finish. Each rank reads its own splits of the stores
(:mod:`students.training.store_windows`; the loader is not re-sharded by accelerate). Optimiser and schedule:
:mod:`students.training.optim`, the run's progress being the nearer of the step and training-byte limits,
computed from the step and byte counters so that a resumed run needs no scheduler state. With
``mixed_precision`` the forward runs under autocast; the loss is computed in float32.

:class:`TrainConfig` is composed of the settings of the modules that read them: the student's
shape (:mod:`students.models.shape`), the batches (:mod:`students.training.batch_source`), the optimiser
(:mod:`students.training.optim`), the loss (:mod:`students.training.loss`), evaluation
(:mod:`students.training.evaluation`), checkpoints (:mod:`students.training.checkpoints`) and
logging (here); run_info.json records its flat settings
(:func:`configs.fields.flat_values`), as the flags name them.

Output directory::

    metrics.jsonl                 one line per evaluation (step, train_bytes, student_bpb, ...)
    run_info.json                 config, teacher/data description, bytes, latest evaluation
    logs/                         TensorBoard (and wandb when asked for)
    checkpoints/step-00001000/    see :mod:`students.training.checkpoints`
    bytedistill_run.json          the run the directory belongs to; see :mod:`students.training.run_directory`

A directory holds one run: a new run into one that holds a run is refused unless ``overwrite``,
and one ``train`` at a time works in it (a lock).

A resumed run (``resume="latest"`` or a checkpoint path) restores weights, optimiser, RNG and
every rank's data position and seeks there (:mod:`students.training.batch_source`), so it continues exactly as if
never stopped; evaluation records after the checkpoint's step are dropped from metrics.jsonl. A new run may start
from a trained student's weights instead of fresh ones (``init_from``, :mod:`students.training.init_from`):
a second stage, with its own optimiser, schedule and counters.
A loss that is not finite (NaN, Inf) stops the run with an error before the next checkpoint, as
do weights that are not finite when a checkpoint is due: the newest checkpoint stays the last good one.
"""

from __future__ import annotations

import dataclasses
import json
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from bytestream.stream_kind import AUTO_STREAM, StreamKind
from common.errors import UserError
from common.files import append_text
from configs.fields import flat_values
from students.models.architectures import architecture_named, student_cost
from students.models.cost import StreamRates, summary_line
from students.models.llama import count_parameters
from students.training import memory as training_memory
from students.training.batch_source import (
    STORE_SOURCE,
    BatchStream,
    DataSource,
    reserved_of_stores,
    streams_of_stores,
    to_device,
    utf8_bytes,
)
from students.training.checkpoints import (
    ANSWERS,
    METRICS,
    RUN_INFO,
    TrainerState,
    checkpoint_dir,
    keep_metrics_until,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    require_architecture,
    require_stream,
    resolve_resume,
    save_checkpoint,
    write_json,
)
from students.training.evaluation import ChatEvalMetrics, EvalMetrics, evaluate
from students.training.hub_stores import RUN_INFO_KEY, hub_pins, with_hub_stores
from students.training.init_from import (
    check_source,
    load_initial_weights,
    recorded_start,
    require_same_start,
    saved_config,
    source_folder,
    start_record,
)
from students.training.loss import counted_targets, distill_loss, resolved_loss_on
from students.training.on_policy import OnPolicy, check_before_run
from students.training.optim import adamw, check_schedule, learning_rate
from students.training.run_directory import TRACKER, claim, refuse_foreign, run_lock, undone_if_unstarted
from students.training.store_windows import SplitBatches
from students.training.train_config import LogConfig, TrainConfig  # noqa: F401 (the run's settings, re-exported)


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
    run_id: str | None = None  # the run the output directory records (main process)
    losses: dict[int, float] = field(default_factory=dict)  # step -> this process's mean loss
    window: tuple[float, int] = (0.0, 0)  # throughput window: start time, bytes since
    on_policy: OnPolicy | None = None  # the student's own sequences (--on-policy)
    init_from: dict[str, Any] | None = None  # the weights the run started from (--init-from), as run_info records it

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


@dataclass(frozen=True)
class TrainPlan:
    """What a run's settings settle to at its entry, read by every step after: none is worked out twice."""

    config: TrainConfig  # with the student's stream and ``--loss-on`` settled (never ``auto``)
    reserved: tuple[str, ...]  # the stores' reserved symbols (a teacher's chat specials), after the stream's
    resume_from: Path | None  # the checkpoint ``--resume`` names, found once
    init_from: Path | None = None  # the folder whose weights ``--init-from`` names, found once


def settle(config: TrainConfig) -> TrainPlan:
    """``config``'s plan: the checkpoint it resumes or the weights it starts from, its stream and its
    chat settings."""
    resume_from = resolve_resume(config.resume, Path(config.output_dir))
    config = with_hub_stores(config, resume_from)  # hf://datasets/… names: the Hub cache's directories
    init_from = None if config.init_from is None else source_folder(config.init_from)
    stream = resolved_stream(config, resume_from, init_from)
    config = dataclasses.replace(config, student=dataclasses.replace(config.student, stream=stream.value))
    config, reserved = with_chat_settings(config)
    if init_from is not None:
        check_source(init_from, config.student.architecture, stream, Path(config.output_dir))
        if resume_from is not None:
            require_same_start(resume_from, init_from)
    return TrainPlan(config, reserved, resume_from, init_from)


def train(config: TrainConfig, source: DataSource = STORE_SOURCE) -> TrainResult:
    """Train (or resume) a student as ``config`` says; returns where it ended."""
    plan = settle(config)
    config, reserved = plan.config, plan.reserved
    architecture_named(config.student.architecture).refuse_stream(config.student.stream_kind)
    if problem := training_memory.over_budget(config, config.student.stream_kind.alphabet_size + len(reserved)):
        raise UserError(problem)
    source.check(
        [*config.train_stores, *([config.eval_store] if config.eval_store else [])],
        config.allow_partial,
        config.student.stream_kind,
    )
    check_before_run(config, bool(reserved))
    output_dir = Path(config.output_dir)
    accelerator = _accelerator(config, Path(config.logging.dir) if config.logging.dir else output_dir / "logs")
    with ExitStack() as held:
        run_id = None
        if accelerator.is_main_process:
            refuse_foreign(output_dir, plan.resume_from)
            held.enter_context(undone_if_unstarted(output_dir))
            held.enter_context(run_lock(output_dir))
            run_id = claim(output_dir, plan.resume_from, overwrite=config.overwrite, resuming=config.resume is not None)
        accelerator.wait_for_everyone()  # the other ranks read the directory once it is claimed
        return train_session(plan, source, accelerator, run_id)


def resolved_stream(config: TrainConfig, resume_from: Path | None, init_from: Path | None = None) -> StreamKind:
    """The student's stream: ``--stream`` when given; for ``auto``, the one the architecture reads from
    the training stores' stream (the first store's: stores of two streams are refused after; a flat
    student reads fused stores as the bytes stream), unless the checkpoint it resumes
    (``resume_from``) or the student it starts from (``init_from``) reads the stores' own stream;
    without stores, that student's stream, else ``<eot>``."""
    if config.student.stream != AUTO_STREAM:
        return StreamKind(config.student.stream)
    earlier = resume_from if resume_from is not None else init_from
    saved = None if earlier is None else StreamKind.of_config(saved_config(earlier))
    stores = streams_of_stores(list(config.train_stores))
    if not stores:
        return saved or StreamKind.EOT
    stored = next(iter(stores.values()))
    return saved if saved is stored else architecture_named(config.student.architecture).stream_from_stores(stored)


def with_chat_settings(config: TrainConfig) -> tuple[TrainConfig, tuple[str, ...]]:
    """``config`` with ``--loss-on`` resolved, and the reserved symbols of its stores (the teacher's
    chat specials, which the student's alphabet takes after the stream's; none for plain text). The
    held-out store must hold the same ones."""
    stores = [*config.train_stores, *([config.eval_store] if config.eval_store else [])]
    reserved = tuple(reserved_of_stores(stores))
    loss_on = resolved_loss_on(config.loss.loss_on, bool(reserved))
    return dataclasses.replace(config, loss=dataclasses.replace(config.loss, loss_on=loss_on)), reserved


def train_session(plan: TrainPlan, source: DataSource, accelerator: Any, run_id: str | None) -> TrainResult:
    """The training itself, in a directory this session may write."""
    config = plan.config
    run, resumed = start_run(plan, source, accelerator)
    run.run_id = run_id
    if not resumed:
        evaluate_and_record(run)
    last_checkpoint = None
    while not _done(config, run.state):
        stats = train_step(run)
        step = run.state.step
        if step % config.logging.every == 0:
            log_training(run, stats)
        if config.eval.every and step % config.eval.every == 0:
            evaluate_and_record(run)
        if config.checkpoints.every and step % config.checkpoints.every == 0:
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


def start_run(plan: TrainPlan, source: DataSource, accelerator: Any) -> tuple[Run, bool]:
    """Model, optimiser and data, restored from a checkpoint when resuming (:func:`settle` makes the plan)."""
    from accelerate.utils import set_seed
    from tqdm.auto import tqdm

    config, reserved, resume_from = plan.config, plan.reserved, plan.resume_from
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    set_seed(config.seed)
    starts_from = plan.init_from if resume_from is None else None
    model, optimizer = accelerator.prepare(*_model_and_optimizer(config, reserved, starts_from))
    common = {
        "rank": accelerator.process_index,
        "world_size": accelerator.num_processes,
        "num_workers": config.batches.num_workers,
        "stream": config.student.stream_kind,
    }
    train_set = source.build(
        config.train_stores,
        config.batches.seq_len,
        config.batches.batch_size,
        with_teacher=config.loss.alpha > 0,
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
            config.batches.seq_len,
            config.batches.batch_size,
            with_teacher=True,
            teacher_dtype="float32",
            shuffle=False,
            seed=0,
            max_symbols=config.eval.max_symbols,
            **common,
        )
        require_one_teacher(train_set, eval_set, config.eval_store)
    state, position = TrainerState(), {"epoch": 0, "batches": 0}
    if resume_from is not None:
        require_architecture(resume_from, config.student.architecture)
        require_stream(resume_from, config.student.stream_kind)
        state, position = load_checkpoint(accelerator, model, resume_from, train_set.order_settings())
        if accelerator.is_main_process:
            keep_metrics_until(output_dir / METRICS, state.step)
            keep_metrics_until(output_dir / ANSWERS, state.step)
    accelerator.init_trackers(TRACKER, config=_hparams(config))
    data = source.describe(config.train_stores)
    cost = student_cost(accelerator.unwrap_model(model))
    accelerator.print(summary_line(cost, _rates(data), config.batches.seq_len, config.student.stream_kind.shown))
    schedule_warning = check_schedule(config.optim, config.max_steps)
    if schedule_warning:
        accelerator.print(schedule_warning)
    bar = tqdm(
        total=config.max_steps,
        initial=state.step,
        disable=not (config.logging.progress and accelerator.is_main_process),
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
    if starts_from is not None:
        run.init_from = start_record(starts_from)
    elif resume_from is not None:
        run.init_from = recorded_start(resume_from)
    if config.on_policy.enabled:
        run.on_policy = OnPolicy.start(config, accelerator, model)
    model.train()
    return run, resume_from is not None


def train_step(run: Run) -> StepStats:
    """One optimizer step over ``grad_accum`` micro-batches; advances the step and byte counters."""
    config, accelerator, model, optimizer, state = run.config, run.accelerator, run.model, run.optimizer, run.state
    lr = learning_rate(config.optim, state.step + 1, progress(config, state.step, state.train_bytes), config.max_steps)
    for group in optimizer.param_groups:
        group["lr"] = lr
    sums = {name: torch.zeros((), device=accelerator.device) for name in ("total", "kl", "ce")}
    step_bytes = torch.zeros((), dtype=torch.int64, device=accelerator.device)
    if run.on_policy is not None:
        run.on_policy.step_started()
    for _ in range(config.batches.grad_accum):
        batch = next(run.stream)
        if run.on_policy is not None:
            batch = run.on_policy.mix(batch, accelerator.unwrap_model(model), run.stream.origin)
        batch = to_device(batch, accelerator.device)
        with accelerator.accumulate(model):
            logits = model(input_ids=batch["input_ids"], use_cache=False).logits
            if run.on_policy is not None:
                out = run.on_policy.loss(logits, batch, config.loss)
            else:
                out = distill_loss(
                    logits,
                    batch["target_ids"],
                    counted_targets(batch, config.loss.loss_on),
                    batch.get("target_probs"),
                    alpha=config.loss.alpha,
                    temperature=config.loss.temperature,
                )
            accelerator.backward(out.total)
            if accelerator.sync_gradients and config.optim.grad_clip > 0:
                accelerator.clip_grad_norm_(model.parameters(), config.optim.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for name in sums:
            sums[name] += getattr(out, name).detach()
        step_bytes += utf8_bytes(batch, config.student.stream_kind)
    if run.on_policy is not None:
        run.on_policy.step_finished(accelerator.device)
    not_finite = (~torch.isfinite(sums["total"])).to(torch.int64)
    added, not_finite = accelerator.reduce(torch.stack([step_bytes, not_finite]), reduction="sum").tolist()
    if not_finite:
        stop_not_finite(run, f"the loss is not finite (NaN or Inf) at step {state.step + 1}")
    state.step += 1
    state.train_bytes += added
    run.window = (run.window[0], run.window[1] + added)
    losses = {name: value / config.batches.grad_accum for name, value in sums.items()}
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
    if run.config.loss.alpha > 0:
        values["train/kl"] = float(mean["kl"])
    if run.on_policy is not None:
        values |= run.on_policy.log_values()
        run.on_policy.record(run.accelerator, run.output_dir / ANSWERS, run.state.step, values["train/loss"])
    run.accelerator.log(values, step=run.state.step)
    run.bar.set_postfix(loss=f"{float(mean['total']):.4f}", bytes_s=f"{rate:,.0f}")


def evaluate_and_record(run: Run) -> EvalMetrics | None:
    """Evaluate on the held-out store (if any); log, append to metrics.jsonl, remember as last_eval."""
    if run.eval_set is None:
        return None
    metrics = evaluate(run.model, run.accelerator, run.eval_set, run.config.batches.seq_len)
    state = run.state
    state.last_eval = {"step": state.step, "train_bytes": state.train_bytes, **dataclasses.asdict(metrics)}
    run.accelerator.log({f"eval/{k}": v for k, v in dataclasses.asdict(metrics).items()}, step=state.step)
    if run.accelerator.is_main_process:
        append_text(run.output_dir / METRICS, json.dumps(state.last_eval) + "\n")  # never through a link
        run.bar.write(
            f"eval step {state.step}: student {metrics.student_bpb:.4f} bpb, teacher {metrics.teacher_bpb:.4f} bpb, "
            f"KL {metrics.kl_per_byte:.4f} bits/byte"
            + (
                f"; assistant: student {metrics.assistant_student_bpb:.4f} bpb, "
                f"teacher {metrics.assistant_teacher_bpb:.4f} bpb"
                if isinstance(metrics, ChatEvalMetrics)
                else ""
            )
        )
    return metrics


def stop_not_finite(run: Run, what: str) -> None:
    """End the session without saving: the newest checkpoint is the last good one."""
    newest = latest_checkpoint(run.output_dir)
    kept = f"the newest checkpoint, {newest}, is kept" if newest else "no checkpoint was saved"
    raise UserError(f"{what}: training stopped, {kept}; try a lower --lr or more --warmup-steps")


def weights_finite(run: Run) -> bool:
    """Every parameter finite, on every process."""
    bad = torch.stack([~torch.isfinite(p).all() for p in run.model.parameters()]).any().to(torch.int64)
    return int(run.accelerator.reduce(bad, reduction="sum")) == 0


def save(run: Run) -> Path:
    """A checkpoint of the current step; older ones beyond ``keep_checkpoints`` are removed."""
    if not weights_finite(run):
        stop_not_finite(run, f"the weights are not finite (NaN or Inf) at step {run.state.step}")
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
        prune_checkpoints(run.output_dir, run.config.checkpoints.keep)
    return path


def finish(run: Run, last_checkpoint: Path) -> TrainResult:
    if run.on_policy is not None:
        run.accelerator.print(run.on_policy.summary())
    if run.accelerator.is_main_process:
        write_json(run.output_dir / RUN_INFO, {**run_info(run), "checkpoint": str(last_checkpoint)})
    run.bar.close()
    run.accelerator.end_training()
    state = run.state
    return TrainResult(state.step, state.train_bytes, run.losses, state.last_eval, last_checkpoint)


def run_info(run: Run) -> dict[str, Any]:
    model = run.accelerator.unwrap_model(run.model)
    return {
        "run_id": run.run_id,
        "config": flat_values(run.config),
        "train_store_paths": [str(Path(store).resolve()) for store in run.config.train_stores],  # export finds them
        "data": run.data,
        "parameters": count_parameters(model),
        "student": dataclasses.asdict(student_cost(model)),
        **({"on_policy": run.on_policy.totals()} if run.on_policy is not None else {}),
        **({"init_from": run.init_from} if run.init_from is not None else {}),
        **dataclasses.asdict(run.state),
        RUN_INFO_KEY: hub_pins([*run.config.train_stores, *([run.config.eval_store] if run.config.eval_store else [])]),
    }


def _rates(data: dict[str, Any]) -> StreamRates | None:
    """The data's symbols and patches per byte, when its description has them."""
    rates = data.get("rates")
    return StreamRates(**rates) if rates else None


def _accelerator(config: TrainConfig, log_dir: Path):
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration, is_wandb_available

    trackers = ["tensorboard"]
    if config.logging.wandb_project:
        if not is_wandb_available():
            raise UserError("--wandb-project needs wandb installed (pip install wandb)")
        trackers.append("wandb")
    return Accelerator(
        mixed_precision=config.mixed_precision,
        gradient_accumulation_steps=config.batches.grad_accum,
        log_with=trackers,
        project_config=ProjectConfiguration(project_dir=str(config.output_dir), logging_dir=str(log_dir)),
    )


def _hparams(config: TrainConfig) -> dict[str, Any]:
    """The config's settings in the scalar types TensorBoard's hparams accept."""
    return {k: v if isinstance(v, (int, float, str, bool)) else json.dumps(v) for k, v in flat_values(config).items()}


def _model_and_optimizer(
    config: TrainConfig, reserved: tuple[str, ...] = (), init_from: Path | None = None
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The run's student, freshly initialised or with the weights of ``init_from``, and its optimiser."""
    architecture = architecture_named(config.student.architecture)
    model = architecture.build(config.student, seq_len=config.batches.seq_len, seed=config.seed, reserved=reserved)
    if init_from is not None:
        load_initial_weights(model, init_from)
    return model, adamw(model, config.optim)


def _done(config: TrainConfig, state: TrainerState) -> bool:
    return bool(
        (config.max_steps and state.step >= config.max_steps)
        or (config.max_train_bytes and state.train_bytes >= config.max_train_bytes)
    )
