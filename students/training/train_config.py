"""A training run's settings (:class:`TrainConfig`), composed of the settings of the modules that
read them: the student's shape (:mod:`students.models.shape`), the batches (:mod:`students.training.batch_source`), the
optimiser (:mod:`students.training.optim`), the loss (:mod:`students.training.loss`), evaluation
(:mod:`students.training.evaluation`), checkpoints (:mod:`students.training.checkpoints`) and logging
(:class:`LogConfig`, the trainer's own). The trainer is :mod:`students.training.trainer`.

Importing it loads no torch: ``bytedistill train --help`` builds its parser from these classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from common.errors import UserError
from configs.fields import flat_values
from configs.ranges import COUNT, SEED, range_problem
from students.models.shape import StudentShape
from students.training.batch_source import BatchConfig
from students.training.checkpoints import CheckpointConfig
from students.training.evaluation import EvalConfig
from students.training.loss import LossConfig
from students.training.on_policy_config import OnPolicyConfig
from students.training.optim import OptimConfig


@dataclass
class LogConfig:
    """What training logs, how often, and where."""

    every: int = field(
        default=10, metadata={"flag": "log_every", "help": "log training loss every N steps", "range": COUNT}
    )
    dir: str | None = field(
        default=None, metadata={"flag": "log_dir", "help": "TensorBoard directory (default: OUTPUT_DIR/logs)"}
    )
    wandb_project: str | None = field(default=None, metadata={"help": "also log to this wandb project (needs wandb)"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})


@dataclass
class TrainConfig:
    """A training run, composed of the settings of the modules that read them; its flags and
    config-file keys are the flat names of :mod:`configs.fields` (``--lr``, not ``--optim.lr``)."""

    train_stores: list[str] = field(
        metadata={
            "help": "logit store directories to train on, or stores on the Hub: hf://datasets/OWNER/NAME[@REVISION]"
        }
    )
    output_dir: str = field(metadata={"help": "directory for checkpoints, metrics.jsonl, run_info.json and logs"})
    eval_store: str | None = field(
        default=None,
        metadata={
            "help": "held-out logit store for periodic evaluation (a directory or hf://datasets/OWNER/NAME[@REVISION])"
        },
    )
    allow_partial: bool = field(
        default=False,
        metadata={
            "help": "train on stores whose dump is unfinished or incomplete (a writer still running, stopped "
            "or never run): on the documents they hold"
        },
    )
    student: StudentShape = field(default_factory=StudentShape)
    batches: BatchConfig = field(default_factory=BatchConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    # the run's length: the schedule runs to the nearer of the two limits
    max_steps: int | None = field(
        default=None, metadata={"help": "stop after this many optimizer steps", "range": COUNT}
    )
    max_train_bytes: int | None = field(
        default=None, metadata={"help": "stop after this many UTF-8 training bytes", "range": COUNT}
    )
    stop_at_step: int | None = field(
        default=None,
        metadata={
            "help": "end this session at this step with a checkpoint (schedule unchanged); resume later",
            "range": COUNT,
        },
    )
    loss: LossConfig = field(default_factory=LossConfig)
    on_policy: OnPolicyConfig = field(default_factory=OnPolicyConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LogConfig = field(default_factory=LogConfig)
    # the run
    seed: int = field(default=0, metadata={"help": "seed for initialisation and data order", "range": SEED})
    mixed_precision: str = field(default="no", metadata={"help": "mixed precision", "choices": ["no", "fp16", "bf16"]})
    resume: str | None = field(
        default=None, metadata={"help": "'latest' (newest checkpoint in OUTPUT_DIR, if any) or a checkpoint directory"}
    )
    init_from: str | None = field(
        default=None,
        metadata={
            "help": "start this new run from the weights of a trained student: a training output directory (its "
            "newest checkpoint), a checkpoint or an exported model folder; optimizer, schedule and step count start "
            "fresh; the student flags must describe its model (architecture, stream, sizes)"
        },
    )
    overwrite: bool = field(
        default=False,
        metadata={"help": "start a new run in an OUTPUT_DIR that holds one, removing that run's files (only those)"},
    )

    def __post_init__(self) -> None:
        if isinstance(self.train_stores, str):
            self.train_stores = [self.train_stores]
        if not self.train_stores:
            raise UserError("give at least one --train-stores directory")
        if self.max_steps is None and self.max_train_bytes is None:
            raise UserError("give --max-steps or --max-train-bytes")
        if problem := range_problem(type(self), flat_values(self)):  # a library caller gets the parser's checks too
            raise UserError(problem)
        seq_len, max_positions = self.batches.seq_len, self.student.max_positions
        if max_positions is not None and seq_len > max_positions:
            raise UserError(f"--seq-len {seq_len} is more than the model's --max-positions {max_positions}")
        if self.optim.min_lr > self.optim.lr:
            raise UserError(f"--min-lr {self.optim.min_lr:g} is more than the peak --lr {self.optim.lr:g}")
        if self.eval_store is not None and Path(self.eval_store).resolve() in {
            Path(s).resolve() for s in self.train_stores
        }:
            raise UserError(f"--eval-store {self.eval_store} is also a --train-stores store: hold out another store")
        if self.overwrite and self.resume is not None:
            raise UserError("give --resume to continue the run in --output-dir or --overwrite to replace it, not both")
