"""Configs from flags or YAML/JSON files, and the shipped example configs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from distill.cli import build_parser
from distill.config import add_config_arguments, config_from_args
from distill.dump import DumpConfig
from distill.errors import UserError
from students.trainer import TrainConfig

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def parse(config_cls, argv):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, config_cls)
    return config_from_args(config_cls, parser.parse_args(argv))


def test_flags_override_the_file(tmp_path):
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"teacher": "t", "corpus": "c", "output": "o", "max-length": 128, "streaming": True}))
    config = parse(DumpConfig, ["--config", str(path), "--max-length", "256", "--end-of-text", "a", "b"])
    assert (config.teacher, config.max_length, config.streaming, config.end_of_text) == ("t", 256, True, ["a", "b"])
    assert parse(DumpConfig, ["--config", str(path), "--streaming", "false"]).streaming is False


def test_unknown_and_missing_options(tmp_path):
    path = tmp_path / "dump.yaml"
    path.write_text("teacher: t\nmax_lenght: 3\n")
    with pytest.raises(UserError, match="unknown option.*max_lenght"):
        parse(DumpConfig, ["--config", str(path)])
    with pytest.raises(UserError, match="missing required option.*--corpus"):
        parse(DumpConfig, ["--teacher", "t", "--output", "o"])
    with pytest.raises(UserError, match="config file not found"):
        parse(DumpConfig, ["--config", str(tmp_path / "nope.yaml")])


@pytest.mark.parametrize("name, config_cls", [("dump.yaml", DumpConfig), ("train.yaml", TrainConfig)])
def test_gpu_example_configs_load(name, config_cls):
    parse(config_cls, ["--config", str(EXAMPLES / "llama3_8b_gpu" / name)])


def test_every_subcommand_has_help_for_every_flag():
    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == {"dump", "inspect", "verify", "train", "export", "generate", "push"}
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
