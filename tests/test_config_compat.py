"""Every documented command line and every example config parses to recorded values.

``tests/data/config_compat.json`` holds, for each case below, the flat values its config parsed to
(one key per flag, as ``--print-config`` writes them), the YAML ``--print-config`` printed for it,
and for each subcommand its ``--help`` options; for each error case, the one line the router
printed. The cases: the example YAMLs, the command lines of README.md and the examples' comments,
the defaults, and one line per subcommand that sets every flag to a value other than its default.
``BYTEDISTILL_RECORD_CONFIGS=1`` rewrites the file from the code as it stands (a change of what a
user sees: review the diff).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
from pathlib import Path

import pytest
import yaml

from bytedistill.cli import COMMANDS, build_parser, config_class
from bytedistill.cli import main as cli_main
from configs.fields import flat_values
from tests.configs import parse_config

ROOT = Path(__file__).resolve().parent.parent
RECORDED = Path(__file__).resolve().parent / "data" / "config_compat.json"
RECORD = os.environ.get("BYTEDISTILL_RECORD_CONFIGS") == "1"
HELP_COLUMNS = "100"

GGUF = "path/to/SmolLM2-135M-Instruct.Q4_1.gguf"

# name -> (subcommand, its arguments): what the documentation shows and what covers every flag
CASES: dict[str, tuple[str, str]] = {
    # the example configs, and the command lines their comments give
    "example train_small_cpu": ("train", "--config examples/train_small_cpu.yaml"),
    "example llama3_8b_gpu train": ("train", "--config examples/llama3_8b_gpu/train.yaml"),
    "example llama3_8b_gpu dump": ("dump", "--config examples/llama3_8b_gpu/dump.yaml"),
    "example llama3_8b_gpu dump heldout": (
        "dump",
        (
            "--config examples/llama3_8b_gpu/dump.yaml --subset heldout --max-bytes 50000000 "
            "--output stores/llama3-8b-fineweb-heldout"
        ),
    ),
    # README.md
    "readme dump train": (
        "dump",
        (
            f"--teacher {GGUF} --corpus corpus/train/kjv.jsonl --output stores/train --max-length 1024 --stride 256 "
            "--batch-tokens 4096"
        ),
    ),
    "readme dump heldout": (
        "dump",
        f"--teacher {GGUF} --corpus corpus/heldout/kjv.jsonl --output stores/heldout --max-length 1024 --stride 256",
    ),
    "readme dump split": (
        "dump",
        f"--teacher {GGUF} --corpus corpus/kjv.jsonl --output stores/train --subset train --heldout-fraction 0.01",
    ),
    "readme dump chat": ("dump", f"--teacher {GGUF} --corpus chats.jsonl --output stores/chat --chat"),
    "readme dump chat respond": (
        "dump",
        (
            f"--teacher {GGUF} --corpus questions.jsonl --output stores/chat-pairs --chat --prompt-field prompt "
            "--respond --respond-tokens 256"
        ),
    ),
    "readme dump chat template": (
        "dump",
        "--teacher path/to/llama3-instruct --corpus chats.jsonl --output stores/llama --chat --chat-template llama3.jinja",
    ),
    "readme inspect": ("inspect", "stores/train"),
    "readme verify": ("verify", "stores/train"),
    "readme train": (
        "train",
        (
            "--train-stores stores/train --eval-store stores/heldout --output-dir runs/student --preset small "
            "--seq-len 256 --batch-size 16 --max-steps 500 --alpha 0.95 --eval-every 50 --resume latest"
        ),
    ),
    "readme train on-policy": (
        "train",
        (
            "--train-stores runs/quickstart/store/train --eval-store runs/quickstart/store/heldout "
            "--output-dir runs/on-policy --seq-len 256 --max-steps 300 --alpha 0.9 --on-policy 0.5 --on-policy-beta 1 "
            f"--teacher {GGUF}"
        ),
    ),
    "readme train patched": (
        "train",
        (
            "--architecture patched --preset small --train-stores stores/train --eval-store stores/heldout "
            "--output-dir runs/patched --seq-len 256 --max-steps 500"
        ),
    ),
    "readme export": (
        "export",
        "runs/student models/byte-student --teacher SmolLM2-135M-Instruct --data 'KJV Genesis'",
    ),
    "readme export-gguf": ("export-gguf", "models/byte-student byte-student.q8_0.gguf --type q8_0"),
    "readme generate": (
        "generate",
        "models/byte-student --prompt 'And God said, ' --max-new-bytes 200 --top-k 50",
    ),
    "readme chat": ("chat", "runs/chat/model --system 'You are a helpful assistant.' --greedy"),
    "readme generate chat": (
        "generate",
        "runs/chat/model --chat --prompts-file questions.txt --max-new-bytes 400 --greedy",
    ),
    "readme score": ("score", "models/byte-student stores/heldout my_text.txt more.jsonl"),
    "readme score packed false": ("score", "models/byte-student stores/heldout --packed false"),
    "readme push-store": ("push-store", "runs/quickstart/store/train your-name/kjv-smollm2-logits"),
    "readme push": (
        "push",
        "models/byte-student your-name/byte-student --private --commit-message 'First student'",
    ),
    "readme dump small memory": (
        "dump",
        (
            f"--teacher {GGUF} --corpus c --output o --batch-tokens 1024 --group-tokens 4096 --head-rows 128 "
            "--chunk-bytes 2097152"
        ),
    ),
    # the defaults: only what is required
    "defaults check-teacher": ("check-teacher", "t"),
    "defaults dump": ("dump", "--teacher t --corpus c --output o"),
    "defaults inspect": ("inspect", "s"),
    "defaults verify": ("verify", "s"),
    "defaults train": ("train", "--train-stores s --output-dir o --max-steps 5"),
    "defaults export": ("export", "c o"),
    "defaults export-gguf": ("export-gguf", "f o"),
    "defaults generate": ("generate", "m"),
    "defaults chat": ("chat", "m"),
    "defaults score": ("score", "m s"),
    "defaults push": ("push", "f r"),
    "defaults push-store": ("push-store", "s r"),
    "defaults serve": ("serve", "m"),
    # every flag set to a value other than its default
    "all check-teacher": ("check-teacher", "t --gguf-file g.gguf --end-of-text '<|a|>' '<|b|>' --seed 7"),
    "all dump": (
        "dump",
        (
            "--teacher t --corpus c --output o --tokenizer tok --gguf-file g.gguf --end-of-text '<|a|>' '<|b|>' "
            "--text-field body --separator '<doc>' --dataset-split validation --dataset-config cfg --streaming "
            "--subset heldout --heldout-fraction 0.25 --max-docs 11 --max-bytes 12345 --max-length 128 --stride 32 "
            "--batch-tokens 1024 --group-tokens 2048 --head-rows 64 --stream fused --conversion torch --writers 3 --device cpu "
            "--dtype bfloat16 --encoding pow12 --chunk-bytes 4096 --encode-threads 3 --docs-per-shard 5 --num-shards 4 --shard-index 2 "
            "--threads 2 --progress false --strict --max-document-bytes 999 --verbose --chat --messages-field conv "
            "--prompt-field q --answer-field a --max-messages 64 --chat-template t.jinja --respond --respond-tokens 64 "
            "--respond-temperature 0.7 --respond-seed 3 --respond-batch 4"
        ),
    ),
    "all inspect": ("inspect", "s --json"),
    "all verify": ("verify", "s --tolerance 0.01 --json"),
    "all train": (
        "train",
        (
            "--train-stores a b --output-dir o --eval-store e --stream fused --architecture patched --preset base "
            "--hidden-size 48 --num-layers 3 --num-heads 3 --num-kv-heads 1 --intermediate-size 96 --max-positions 64 "
            "--rope-theta 500000 --local-hidden-size 32 --local-layers 2 --local-window 16 --seq-len 32 "
            "--batch-size 4 --grad-accum 2 --num-workers 1 --lr 3e-4 --min-lr 3e-5 --warmup-steps 7 "
            "--weight-decay 0.01 --grad-clip 0.5 --max-steps 50 --max-train-bytes 100000 --stop-at-step 20 "
            "--alpha 0.5 --temperature 2 --eval-every 5 --eval-bytes 1000 --checkpoint-every 10 "
            "--keep-checkpoints 2 --log-every 2 --log-dir logs --wandb-project p --progress false --seed 9 "
            "--mixed-precision bf16 --resume latest --allow-partial --loss-on all --on-policy 0.5 --on-policy-beta 1 "
            "--on-policy-temperature 0.7 --on-policy-bytes 8 --teacher t.gguf --teacher-device cpu --init-from w"
        ),
    ),
    "all train overwrite": ("train", "--train-stores s --output-dir o --max-steps 5 --overwrite"),
    "all export": (
        "export",
        "c o --teacher-tokenizer tok.json --repo-id me/m --license mit --teacher T --data D",
    ),
    "all export-gguf": ("export-gguf", "f o --type q8_0"),
    "all generate": (
        "generate",
        (
            "m --prompt hi there --prompt again --prompts-file prompts.txt --max-new-bytes 10 --temperature 0.5 "
            "--top-k 5 --top-p 0.9 --greedy --seed 3 --compile --chat --system 'Be brief.' --output-format jsonl"
        ),
    ),
    "all chat": (
        "chat",
        "m --system 'Be brief.' --max-new-bytes 10 --temperature 0.5 --top-k 5 --top-p 0.9 --greedy --seed 3 --compile",
    ),
    "all serve": (
        "serve",
        (
            "m --host 0.0.0.0 --port 9001 --api-key k --model-name tiny --slots 4 --max-queue 9 --max-prompt-bytes 100 "
            "--max-tokens-limit 64 --default-max-tokens 32 --compile --warm-up-entries 128 --device cuda"
        ),
    ),
    "readme serve": ("serve", "runs/quickstart/model --port 8000 --slots 8"),
    "all score": (
        "score",
        (
            "m a.txt b.jsonl --mode plain --context 64 --stride 16 --packed false --batch-size 2 --text-field body "
            "--progress false"
        ),
    ),
    "all push": (
        "push",
        (
            "f me/r --private --revision dev --commit-message msg --endpoint https://hub.example --timeout 5 "
            "--retries 1 --dry-run"
        ),
    ),
    "all push-store": (
        "push-store",
        (
            "s me/r --private --revision dev --commit-message msg --commit-bytes 1000 --allow-partial "
            "--endpoint https://hub.example --timeout 5 --retries 1 --dry-run"
        ),
    ),
}

# name -> (subcommand, its arguments): each is refused in one line, recorded
ERRORS: dict[str, tuple[str, str]] = {
    "train lr not positive": ("train", "--train-stores s --output-dir o --max-steps 5 --lr -0.001"),
    "train seq_len below 2": ("train", "--train-stores s --output-dir o --max-steps 5 --seq-len 1"),
    "train alpha above 1": ("train", "--train-stores s --output-dir o --max-steps 5 --alpha 1.5"),
    "train on_policy above 1": ("train", "--train-stores s --output-dir o --max-steps 5 --on-policy 1.5"),
    "train seed too large": ("train", "--train-stores s --output-dir o --max-steps 5 --seed 4294967296"),
    "train num_workers negative": ("train", "--train-stores s --output-dir o --max-steps 5 --num-workers -1"),
    "train local_window zero": ("train", "--train-stores s --output-dir o --max-steps 5 --local-window 0"),
    "train eval_every negative": ("train", "--train-stores s --output-dir o --max-steps 5 --eval-every -1"),
    "train keep_checkpoints negative": ("train", "--train-stores s --output-dir o --max-steps 5 --keep-checkpoints -2"),
    "train no limit": ("train", "--train-stores s --output-dir o"),
    "train seq_len over max_positions": ("train", "--train-stores s --output-dir o --max-steps 5 --max-positions 8"),
    "train min_lr over lr": ("train", "--train-stores s --output-dir o --max-steps 5 --lr 1e-4 --min-lr 1e-3"),
    "train eval store is a train store": ("train", "--train-stores s --output-dir o --max-steps 5 --eval-store s"),
    "train resume and overwrite": (
        "train",
        "--train-stores s --output-dir o --max-steps 5 --resume latest --overwrite",
    ),
    "train print-config lr not positive": (
        "train",
        "--train-stores s --output-dir o --max-steps 5 --lr 0 --print-config",
    ),
    "train not a number": ("train", "--train-stores s --output-dir o --max-steps 5 --lr fast"),
    "train bad choice": ("train", "--train-stores s --output-dir o --max-steps 5 --architecture deep"),
    "train unknown flag": ("train", "--train-stores s --output-dir o --max-steps 5 --learning-rate 1"),
    "train missing output": ("train", "--train-stores s --max-steps 5"),
    "dump heldout_fraction above 1": ("dump", "--teacher t --corpus c --output o --heldout-fraction 2"),
    "export-gguf bad type": ("export-gguf", "f o --type q4_0"),
    "serve slots zero": ("serve", "m --slots 0"),
    "serve port out of range": ("serve", "m --port 70000"),
    "dump max_docs zero": ("dump", "--teacher t --corpus c --output o --max-docs 0"),
    "dump stride negative": ("dump", "--teacher t --corpus c --output o --stride -1"),
    "dump writers zero": ("dump", "--teacher t --corpus c --output o --writers 0"),
    "dump bad subset": ("dump", "--teacher t --corpus c --output o --subset test"),
    "dump bad dtype": ("dump", "--teacher t --corpus c --output o --dtype bfloat17"),
    "dump max_length not a number": ("dump", "--teacher t --corpus c --output o --max-length long"),
    "dump missing corpus": ("dump", "--teacher t --output o"),
    "dump unknown flag": ("dump", "--teacher t --corpus c --output o --dataset-name x"),
    "verify tolerance zero": ("verify", "s --tolerance 0"),
    "generate top_p zero": ("generate", "m --top-p 0"),
    "score context 1": ("score", "m s --context 1"),
    "push retries negative": ("push", "f r --retries -1"),
    "check-teacher seed negative": ("check-teacher", "t --seed -1"),
}


def _argv(arguments: str) -> list[str]:
    return shlex.split(arguments)


def _printed_config(command: str, argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        cli_main([command, *argv, "--print-config"])
    assert exit_info.value.code == 0
    return out.getvalue()


def _json_ready(value):
    """A value as JSON holds it (tuples are lists)."""
    return json.loads(json.dumps(value))


def _help_options(command: str) -> list[str]:
    """A subcommand's ``--help`` options, one block of text each, sorted (the usage line aside)."""
    subcommands = build_parser()._subcommands_action
    text = subcommands._name_parser_map[command].format_help()
    blocks: list[str] = []
    for line in text.split("\n\n", 1)[1].splitlines():  # past the usage lines
        if re.match(r"^  \S", line):
            blocks.append(line)
        elif blocks and line.startswith("   "):
            blocks[-1] += "\n" + line
    return sorted(blocks)


def _error_line(command: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    cls = config_class(COMMANDS[command])

    def must_not_run(config) -> int:
        raise AssertionError(f"{command} ran with {config}")

    must_not_run.__annotations__ = {"config": cls, "return": int}
    monkeypatch.setitem(COMMANDS, command, must_not_run)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli_main([command, *argv]) == 2
    assert err.getvalue().count("\n") == 1, err.getvalue()
    return err.getvalue().rstrip("\n")


def observed(monkeypatch: pytest.MonkeyPatch) -> dict:
    """What the code as it stands makes of every case."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("COLUMNS", HELP_COLUMNS)
    cases = {}
    for name, (command, arguments) in CASES.items():
        argv = _argv(arguments)
        values = flat_values(parse_config(config_class(COMMANDS[command]), argv))
        printed = yaml.safe_load(_printed_config(command, argv))
        cases[name] = {"command": command, "argv": argv, "values": values, "printed": printed}
    errors = {
        name: _error_line(command, _argv(arguments), monkeypatch) for name, (command, arguments) in ERRORS.items()
    }
    helps = {command: _help_options(command) for command in COMMANDS}
    return _json_ready({"cases": cases, "errors": errors, "help": helps})


@pytest.fixture(scope="module")
def now() -> dict:
    with pytest.MonkeyPatch.context() as monkeypatch:
        result = observed(monkeypatch)
    if RECORD:
        RECORDED.parent.mkdir(exist_ok=True)
        RECORDED.write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return result


@pytest.fixture(scope="module")
def recorded(now) -> dict:
    return json.loads(RECORDED.read_text(encoding="utf-8"))


def test_every_case_parses_to_its_recorded_values(now, recorded):
    assert set(now["cases"]) == set(recorded["cases"]) == set(CASES)
    for name, case in recorded["cases"].items():
        assert now["cases"][name]["values"] == case["values"], name


def test_print_config_writes_the_recorded_flat_yaml_and_reads_back(now, recorded, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    for name, case in recorded["cases"].items():
        assert now["cases"][name]["printed"] == case["printed"], name
        printed = tmp_path / "printed.yaml"
        printed.write_text(_printed_config(case["command"], case["argv"]))
        cls = config_class(COMMANDS[case["command"]])
        assert flat_values(parse_config(cls, ["--config", str(printed)])) == flat_values(
            parse_config(cls, case["argv"])
        ), name


def test_every_error_is_the_recorded_line(now, recorded):
    assert now["errors"] == recorded["errors"]
    assert set(recorded["errors"]) == set(ERRORS)


def test_help_lists_the_recorded_options(now, recorded):
    assert now["help"] == recorded["help"]


def test_the_all_flags_lines_set_every_flag_to_a_value_other_than_its_default(recorded):
    for command in COMMANDS:
        defaults = recorded["cases"][f"defaults {command}"]["values"]
        given = set(_argv(CASES[f"defaults {command}"][1]))  # the required values, the same everywhere
        changed = [
            case["values"] for name, case in recorded["cases"].items() if name.split(" ")[:2] == ["all", command]
        ]
        unchanged = {key for key in defaults if all(values[key] == defaults[key] for values in changed)}
        required = {
            key
            for key in unchanged
            if set(defaults[key] if isinstance(defaults[key], list) else [defaults[key]]) <= given
        }
        assert changed and unchanged == required, (command, unchanged - required)
