"""A text setting stays the text it was given, from flags and from YAML, and ``--print-config``
reads back to the same run, for every command's text settings and strings YAML would read as
numbers, booleans, nulls or dates (bytedistill/config_yaml.py)."""

from __future__ import annotations

import contextlib
import functools
import io
import typing

import pytest

from bytedistill.cli import COMMANDS, config_class
from bytedistill.cli import main as cli_main
from bytedistill.config import check_config_files, config_files_first, config_from_namespace, config_parser
from bytedistill.config_yaml import MAX_VALUES, ConfigTextError, load_config
from configs.fields import flat_values, leaves
from tests.configs import parse_config

# strings that YAML 1.1 or 1.2, or jsonargparse's loader, would read as something else
TRICKY = [
    "1e3",
    "1e-5",
    "5e10",
    "1_000",
    "0x10",
    "0o7",
    "010",
    ".5",
    "+1",
    "1:20",
    ".inf",
    ".nan",
    "yes",
    "no",
    "on",
    "Off",
    "y",
    "n",
    "true",
    "False",
    "null",
    "~",
    "None",
    "2001-12-14",
    "a: b",
    "[x]",
    "{x}",
    "#c",
    "'q'",
    '"q"',
    "&a",
    "*a",
    "!tag",
    "x #y",
    " lead",
    "trail ",
    "<<",
    "",
]


def _text_leaves(command: str):
    """The command's text settings (``str``, ``str | None``, lists of them), not those of choices."""
    found = []
    for leaf in leaves(config_class(COMMANDS[command])):
        annotation = leaf.annotation
        inner = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
        item = typing.get_args(inner[0])[0] if typing.get_origin(inner[0]) is list else inner[0]
        if item is str and "choices" not in leaf.field.metadata:
            found.append(leaf)
    return found


@functools.cache
def _parser(command: str):
    return config_parser(config_class(COMMANDS[command]))


def _argv(command: str, round_: int) -> tuple[list[str], dict[str, object]]:
    """A command line that sets every text setting of ``command`` to a value of :data:`TRICKY`, each
    its own (the ``round_``-th after its place: over all rounds, each setting takes every value), and
    what it sets."""
    positional, flags, expected = [], [], {}
    for place, leaf in enumerate(_text_leaves(command)):
        value = TRICKY[(round_ + place) % len(TRICKY)]
        is_list = typing.get_origin(leaf.annotation) is list or "list" in str(leaf.annotation)
        optional = type(None) in typing.get_args(leaf.annotation)
        # a command line's `null` unsets a setting that may be unset (a config file's value, say)
        expected[leaf.name] = [value] if is_list else None if value == "null" and optional else value
        if leaf.field.metadata.get("positional"):
            positional.append(value)
        else:
            flags += [f"--{leaf.name.replace('_', '-')}", value]
    return [*positional, *flags], expected


def _parsed(command: str, argv: list[str]) -> dict:
    """The flat settings ``argv`` parses to (as tests/configs.py parses, with one parser a command)."""
    check_config_files(argv)
    namespace = _parser(command).parse_args(config_files_first(argv))
    return flat_values(config_from_namespace(config_class(COMMANDS[command]), namespace))


def _printed(command: str, argv: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        _parser(command).parse_args(config_files_first([*argv, "--print-config"]))
    return out.getvalue()


EXTRA = {"train": ["--max-steps", "5"]}  # what a command needs besides its text settings


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_text_setting_keeps_its_text_through_print_config(command, tmp_path):
    assert _text_leaves(command), command
    for round_ in range(len(TRICKY)):
        argv, expected = _argv(command, round_)
        argv += EXTRA.get(command, [])
        given = _parsed(command, argv)
        assert {name: given[name] for name in expected} == expected, (command, argv)
        printed = tmp_path / "printed.yaml"
        printed.write_text(_printed(command, argv))
        assert _parsed(command, ["--config", str(printed)]) == given, (command, argv, printed.read_text())


def test_plain_yaml_values_of_text_settings_are_their_text(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: 5e10\nprompt: [yes, 0x10, null, 1e3, ~, 2001-12-14]\nprompts_file: null\n")
    config = parse_config(config_class(COMMANDS["generate"]), ["--config", str(path)])
    assert config.model == "5e10" and config.prompt == ["yes", "0x10", "null", "1e3", "~", "2001-12-14"]
    assert config.prompts_file is None  # a setting's own null is unset
    path.write_text("train_stores: 1e3\noutput_dir: 2e3\nmax_steps: 5\nmixed_precision: no\nlr: 1e-3\n")
    config = parse_config(config_class(COMMANDS["train"]), ["--config", str(path)])
    assert (config.train_stores, config.output_dir, config.mixed_precision) == (["1e3"], "2e3", "no")
    assert config.optim.lr == 1e-3 and isinstance(config.optim.lr, float)  # a number setting reads numbers


@pytest.mark.parametrize(
    "argv",
    [
        ["generate", "M", "--prompt", "1e3", "1e-5", "5e10", "yes", "0x10", "null"],
        ["train", "--train-stores", "1e3", "--output-dir", "2e3", "--max-steps", "5"],
    ],
)
def test_the_cli_prints_a_config_that_reads_back(argv, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli_main([*argv, "--print-config"])
    first = capsys.readouterr().out
    (tmp_path / "c.yaml").write_text(first)
    with pytest.raises(SystemExit):
        cli_main([argv[0], "--config", str(tmp_path / "c.yaml"), "--print-config"])
    assert capsys.readouterr().out == first
    assert "- '1e3'" in first or "'1e3'" in first


def test_aliases_past_the_bound_and_recursive_ones_are_refused_before_they_are_built():
    laughs = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{','.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
    )
    assert len(laughs) < 400
    with pytest.raises(ConfigTextError, match=f"more than {MAX_VALUES:,} values"):
        load_config(laughs)
    with pytest.raises(ConfigTextError, match="recursive alias"):
        load_config("a: &x [*x]\n")
    assert load_config("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}  # aliases within the bound read
