"""Configs from flags or YAML/JSON files, the command table, and the shipped example configs."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from bytedistill.cli import COMMANDS, config_class
from bytedistill.cli import main as cli_main
from common.errors import UserError
from configs.fields import leaves
from distill.dump.run import DumpConfig
from students.training.trainer import TrainConfig
from tests.configs import parse_config

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TRAIN = ["--train-stores", "s", "--output-dir", "o", "--max-steps", "5"]


def test_yaml_values_arrive_with_their_field_types(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("lr: 3e-4\nmin-lr: 1e-5\nmax_steps: 7\ntrain_stores: [a, b]\noutput_dir: o\nprogress: false\n")
    config = parse_config(TrainConfig, ["--config", str(path)])
    assert config.optim.lr == 3e-4 and isinstance(config.optim.lr, float) and config.optim.min_lr == 1e-5
    assert (config.max_steps, config.train_stores, config.logging.progress) == (7, ["a", "b"], False)
    path.write_text("max_steps: many\n")
    with pytest.raises(UserError, match="max_steps"):
        parse_config(TrainConfig, [*TRAIN, "--config", str(path)])


def test_json_file_and_flags_win_wherever_they_stand(tmp_path):
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"teacher": "t", "corpus": "c", "output": "o", "max-length": 128, "streaming": True}))
    config = parse_config(DumpConfig, ["--max-length", "256", "--config", str(path), "--end-of-text", "a", "b"])
    assert (config.teacher.source, config.windows.max_length, config.corpus.streaming, config.teacher.end_of_text) == (
        "t",
        256,
        True,
        ["a", "b"],
    )
    assert parse_config(DumpConfig, ["--config", str(path), "--streaming", "false"]).corpus.streaming is False
    assert parse_config(DumpConfig, ["--config", str(path), "--stride", "3"]).windows.max_length == 128


def test_a_lone_value_for_a_list_field_is_a_one_item_list(tmp_path, capsys):
    path = tmp_path / "train.yaml"
    path.write_text("train_stores: a\noutput_dir: o\nmax_steps: 5\n")
    assert parse_config(TrainConfig, ["--config", str(path)]).train_stores == ["a"]
    assert parse_config(TrainConfig, ["--config", str(path), "--train-stores", "x", "y"]).train_stores == ["x", "y"]
    with pytest.raises(SystemExit):
        cli_main(["train", "--config", str(path), "--print-config"])
    assert "train_stores:\n- a\n" in capsys.readouterr().out
    path.write_text("teacher: t\ncorpus: c\noutput: o\nend-of-text: <|x|>\n")
    assert parse_config(DumpConfig, ["--config", str(path)]).teacher.end_of_text == ["<|x|>"]
    path.write_text("train_stores: 5\noutput_dir: o\nmax_steps: 5\n")  # a text setting's value is its text
    assert parse_config(TrainConfig, ["--config", str(path)]).train_stores == ["5"]
    path.write_text("train_stores: {a: 1}\noutput_dir: o\n")
    with pytest.raises(UserError, match="train_stores"):
        parse_config(TrainConfig, ["--config", str(path)])


def test_a_dump_config_is_grouped_by_the_modules_that_read_it_under_the_same_flat_flags():
    """DumpConfig holds its settings in groups, each declared by the module that reads it (as
    TrainConfig's are); the flags are the flat ones recorded before the grouping, and a flat config
    builds the same groups back."""
    import typing

    from configs.fields import flat_values, from_flat
    from distill.corpus.conversations import ConversationFields
    from distill.corpus.spec import CorpusSpec
    from distill.dump.config import Batching, ChatSettings, RespondSettings, StoreSettings
    from distill.teacher.source import TeacherSource
    from distill.teacher.windows import TeacherWindows

    hints = typing.get_type_hints(DumpConfig)
    groups = {name: kind for name, kind in hints.items() if dataclasses.is_dataclass(kind)}
    assert groups == {
        "teacher": TeacherSource,
        "corpus": CorpusSpec,
        "windows": TeacherWindows,
        "batching": Batching,
        "store": StoreSettings,
        "chat": ChatSettings,
        "answers": RespondSettings,
    }
    assert typing.get_type_hints(ChatSettings)["fields"] is ConversationFields
    loose = set(hints) - set(groups)
    assert loose == {
        "output",
        "job_count",
        "job_index",
        "threads",
        "progress",
        "strict",
        "max_document_bytes",
        "verbose",
    }
    recorded = json.loads((Path(__file__).parent / "data" / "config_compat.json").read_text())
    assert [leaf.name for leaf in leaves(DumpConfig)] and {leaf.name for leaf in leaves(DumpConfig)} == set(
        recorded["cases"]["defaults dump"]["values"]
    )
    argv = ["--teacher", "t", "--corpus", "c", "--output", "o", "--max-length", "64", "--dtype", "float16"]
    argv += ["--messages-field", "m", "--respond-seed", "3", "--num-shards", "2", "--encoding", "pow8"]
    config = parse_config(DumpConfig, [*argv, "--head-rows", "8"])
    assert (config.teacher.source, config.teacher.dtype, config.windows.max_length) == ("t", "float16", 64)
    assert (config.chat.fields.messages, config.answers.seed, config.job_count) == ("m", 3, 2)
    assert (config.store.encoding, config.batching.head_rows, config.corpus.source) == ("pow8", 8, "c")
    assert from_flat(DumpConfig, flat_values(config)) == config


def test_unknown_missing_and_mistyped_options(tmp_path):
    path = tmp_path / "dump.yaml"
    path.write_text("teacher: t\nmax_lenght: 3\n")
    with pytest.raises(UserError, match="max_lenght"):
        parse_config(DumpConfig, ["--config", str(path)])
    with pytest.raises(UserError, match="required.*corpus"):
        parse_config(DumpConfig, ["--teacher", "t", "--output", "o"])
    with pytest.raises(UserError, match="nope.yaml"):
        parse_config(DumpConfig, ["--config", str(tmp_path / "nope.yaml")])
    with pytest.raises(UserError, match="bfloat17"):
        parse_config(DumpConfig, ["--teacher", "t", "--corpus", "c", "--output", "o", "--dtype", "bfloat17"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", *TRAIN, "--lr", "fast"], "bytedistill train: error: .*lr"),
        (["train", *TRAIN, "--no-such-flag", "1"], "bytedistill train: error: .*--no-such-flag"),
        (["dump", "--teacher", "t", "--output", "o"], "bytedistill dump: error: .*required: corpus$"),
        (["retrain"], "bytedistill: error: .*retrain"),
        # a misspelt flag is refused, not taken for the flag it abbreviates (argparse's allow_abbrev)
        (
            ["generate", "m", "--max-new-byte", "10"],
            "bytedistill generate: error: unrecognized arguments: --max-new-byte",
        ),
        (["train", *TRAIN, "--max-step", "3"], "bytedistill train: error: unrecognized arguments: --max-step 3"),
        (["--versio"], "bytedistill: error: unrecognized arguments: --versio"),
    ],
)
def test_a_mistake_is_one_line_and_exit_2(argv, message, capsys):
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match(message, err.strip()), err


def test_every_argument_parser_refuses_abbreviated_flags():
    """The commands', the benchmarks' and the examples' parsers: each is made with allow_abbrev=False."""
    root = EXAMPLES.parent
    sources = [path for folder in ("bytedistill", "benchmarks", "examples") for path in (root / folder).rglob("*.py")]
    calls = [
        (path.name, text[start : start + 400])
        for path in sources
        for text in [path.read_text(encoding="utf-8")]
        for start in [m.start() for m in re.finditer(r"\bArgumentParser\(", text)]
    ]
    assert len(calls) > 20 and [name for name, call in calls if "allow_abbrev=False" not in call] == []


def test_version_prints_the_installed_version(capsys):
    from importlib.metadata import version

    assert cli_main(["--version"]) == 0
    assert capsys.readouterr().out == f"bytedistill {version('bytedistill')}\n"


def test_no_arguments_print_the_subcommands_and_exit_2(capsys):
    assert cli_main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: bytedistill") and all(name in err for name in COMMANDS)


def test_an_unknown_key_in_a_file_is_one_line_naming_it(tmp_path, capsys):
    path = tmp_path / "train.yaml"
    path.write_text("lr: 1e-3\nlearning_rate: 1e-3\n")
    assert cli_main(["train", *TRAIN, "--config", str(path)]) == 2
    assert (
        capsys.readouterr().err
        == "bytedistill train: error: Subcommand 'train' does not accept option 'learning_rate'\n"
    )


def test_print_config_round_trips(tmp_path, capsys):
    argv = [*TRAIN, "--lr", "3e-4", "--train-stores", "a", "b", "--alpha", "0.5"]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["train", *argv, "--print-config"])
    assert exit_info.value.code == 0
    printed = tmp_path / "run.yaml"
    printed.write_text(capsys.readouterr().out)
    expected = parse_config(TrainConfig, argv)
    assert parse_config(TrainConfig, ["--config", str(printed)]) == expected
    assert (expected.optim.lr, expected.train_stores, expected.loss.alpha) == (3e-4, ["a", "b"], 0.5)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_subcommand_has_help_for_every_flag(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main([name, "--help"])
    assert exit_info.value.code == 0
    text = "".join(capsys.readouterr().out.split())  # help wraps lines, at spaces and hyphens
    for leaf in leaves(config_class(COMMANDS[name])):
        assert leaf.field.metadata.get("help"), f"{name} {leaf.name} has no help"
        flag = leaf.name if leaf.field.metadata.get("positional") else "--" + leaf.name.replace("_", "-")
        assert flag in text and "".join(leaf.field.metadata["help"].split()) in text, (name, leaf.name)
    assert "<function" not in text, f"{name} --help names a type wrapper instead of the choices"


def test_a_command_module_that_fails_to_import_is_an_error(monkeypatch):
    import bytedistill

    monkeypatch.delattr(bytedistill, "export")
    monkeypatch.setitem(sys.modules, "bytedistill.export", None)  # what a broken module looks like to import
    spec = importlib.util.find_spec("bytedistill.cli")
    with pytest.raises(ImportError, match="export"):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


@pytest.mark.parametrize(
    "path, config_cls",
    [
        ("llama3_8b_gpu/dump.yaml", DumpConfig),
        ("llama3_8b_gpu/train.yaml", TrainConfig),
        ("train_small_cpu.yaml", TrainConfig),
    ],
)
def test_example_configs_parse(path, config_cls):
    config = parse_config(config_cls, ["--config", str(EXAMPLES / path)])
    assert isinstance(config, config_cls)
    if config_cls is TrainConfig:
        assert isinstance(config.optim.lr, float) and isinstance(config.optim.min_lr, float)


@dataclasses.dataclass
class ScoreLikeConfig:
    model: str = dataclasses.field(metadata={"help": "model folder", "positional": True})
    sources: list[str] = dataclasses.field(metadata={"help": "files to score", "positional": True})
    suffix: str = dataclasses.field(default="!", metadata={"help": "printed after each source", "positional": True})
    mode: str = dataclasses.field(default="stream", metadata={"help": "how", "choices": ["stream", "plain"]})
    context: int | None = dataclasses.field(default=None, metadata={"help": "window length"})


def score_like(config: ScoreLikeConfig) -> int:
    """Print what it was given.

    A subcommand added as the module docstring of bytedistill/cli.py says: a config, a function, one line.
    """
    print(config)
    return 3 if config.context is None else 0


def test_a_new_subcommand_is_one_table_entry(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(COMMANDS, "score-like", score_like)
    assert cli_main(["score-like", "m", "a.txt", "b.txt", "--mode", "plain", "--context", "64"]) == 0
    assert capsys.readouterr().out == f"{ScoreLikeConfig('m', ['a.txt', 'b.txt'], '!', 'plain', 64)}\n"
    (tmp_path / "s.yaml").write_text("model: m\nsources: [a.txt]\n")
    assert cli_main(["score-like", "--config", str(tmp_path / "s.yaml")]) == 3
    assert capsys.readouterr().out == f"{ScoreLikeConfig('m', ['a.txt'])}\n"
    assert cli_main(["score-like", "m", "--mode", "fast"]) == 2
    assert "bytedistill score-like: error:" in capsys.readouterr().err
