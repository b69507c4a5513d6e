"""Typed dataclass configs that come from CLI flags, a YAML/JSON file, or both.

Each command declares one dataclass, which may be composed of the dataclasses of the modules
that read its settings; :func:`config_parser` turns its settings (the leaves,
:mod:`configs.fields`) into the flat arguments of a ``jsonargparse`` parser, which
coerces every value to the field's type (from flags and from files alike: ``lr: 3e-4`` in YAML is
a float), refuses unknown keys, reads ``--config FILE`` (flags win, wherever they stand) and
writes a run's full config with ``--print-config``. Field metadata drives the rest: ``help`` (the
``--help`` text), ``choices``, ``positional`` (an argument without a flag) and ``range`` (a
:class:`Range`: every numeric field has one; a value outside it is refused when parsed, in one
line naming the flag, and ``--help`` shows it).
Flags are the settings' flat names with dashes (``max_length`` -> ``--max-length``), never dotted
paths into the groups, and :func:`config_from_namespace` builds the nested config back; a file has
the same flat keys, may spell them either way, and may give a list field one value without
brackets (``train_stores: a`` is ``[a]``).
A ``--config`` file that is not UTF-8 or not valid YAML/JSON, or whose aliases expand past a bound,
is refused in one line naming it. A text setting's plain values stay the text they are written as
(``prompt: [yes, 1e3]`` is two strings), and ``--print-config`` quotes what would read back as
another type, so that its output reads back to the same run (:mod:`bytedistill.config_yaml`).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, set_dumper, set_loader

from bytedistill.config_yaml import ConfigTextError, dump_config, load_config, load_value
from common.errors import UserError
from configs.fields import Leaf, from_flat, leaves
from configs.ranges import flag_name, range_problem

T = TypeVar("T")

# argparse takes "-1e-3" for an option, not a number ("expected one argument"); any float is a number
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


def _config_paths(argv: Sequence[str]) -> list[Path]:
    paths, args = [], iter(argv)
    for arg in args:
        if arg == "--config":
            paths.append(Path(next(args, "")))
        elif arg.startswith("--config="):
            paths.append(Path(arg.removeprefix("--config=")))
    return paths


def check_config_files(argv: Sequence[str]) -> None:
    """Refuse a ``--config`` file that is not UTF-8 or not YAML/JSON in one line naming it
    (jsonargparse would raise the loader's exception)."""
    for path in _config_paths(argv):
        if not path.is_file():
            continue  # jsonargparse says it is not found
        try:
            load_config(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise UserError(f"--config {path}: not UTF-8 text (byte {exc.start})") from None
        except ConfigTextError as exc:
            raise UserError(f"--config {path}: refused: {exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise UserError(f"--config {path}: not valid YAML or JSON ({where}{problem})") from None


def _list_item_type(annotation: Any) -> type | None:
    """The item type of ``list[X]`` or ``list[X] | None``; None for any other annotation."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _list_item_type(inner[0]) if len(inner) == 1 else None
    if typing.get_origin(annotation) is list:
        return typing.get_args(annotation)[0]
    return None


def _field_default(field: dataclasses.Field) -> Any:
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def _add_leaf(parser: ArgumentParser, leaf: Leaf) -> None:
    """One argument for one setting; lists take space-separated values (``--end-of-text a b``)."""
    field, annotation = leaf.field, leaf.annotation
    if "choices" in field.metadata:  # a Literal, so that --help names the choices, not a wrapper
        annotation = typing.Literal[tuple(field.metadata["choices"])]
    help_text = field.metadata.get("help")
    if "range" in field.metadata:
        help_text = f"{help_text} ({field.metadata['range']})"
    kwargs: dict[str, Any] = {"help": help_text, "type": annotation}
    item_type = _list_item_type(annotation)
    if item_type is not None:
        kwargs.update(type=item_type, nargs="+")
        if field.metadata.get("repeatable"):  # `--prompt a --prompt b` adds up, as `--prompt a b` does
            kwargs["action"] = "extend"
    elif annotation is bool:
        kwargs.update(nargs="?", const=True)  # `--flag` alone means true; `--flag false` too
    default = _field_default(field)
    if field.metadata.get("positional") and default is dataclasses.MISSING:
        parser.add_argument(leaf.name, **kwargs)
    elif field.metadata.get("positional"):
        kwargs["nargs"] = "*" if item_type is not None else "?"
        parser.add_argument(leaf.name, default=default, **kwargs)
    elif default is dataclasses.MISSING:
        parser.add_argument(flag_name(leaf.name), required=True, **kwargs)
    else:
        parser.add_argument(flag_name(leaf.name), default=default, **kwargs)


def _scalars_as_lists(loaded: Any, list_keys: frozenset[str]) -> Any:
    """A loaded config mapping with a lone value under a list field's key made a one-item list."""
    if not isinstance(loaded, dict):
        return loaded
    return {
        k: [v] if k.replace("-", "_") in list_keys and not isinstance(v, list) and v is not None else v
        for k, v in loaded.items()
    }


def _is_text(leaf: Leaf) -> bool:
    """Whether a setting holds text: a ``str`` (or None), a list of them, or one of its choices."""
    annotation = _list_item_type(leaf.annotation) or leaf.annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        annotation = next((a for a in typing.get_args(annotation) if a is not type(None)), None)
    return annotation is str or "choices" in leaf.field.metadata


def _yaml_mode(config_cls: type) -> str:
    """A ``jsonargparse`` parser mode: YAML read and written by :mod:`bytedistill.config_yaml` (a
    text setting's plain values stay the text they are written as; strings printed so that they read
    back), and a lone value for a list field is a one-item list."""
    mode = f"yaml:{config_cls.__module__}.{config_cls.__qualname__}"
    list_keys = frozenset(leaf.name for leaf in leaves(config_cls) if _list_item_type(leaf.annotation))
    text_keys = frozenset(leaf.name for leaf in leaves(config_cls) if _is_text(leaf))
    set_loader(
        mode,
        lambda text, path=None: _scalars_as_lists(load_value(text, text_keys, path), list_keys),
        exceptions=(yaml.YAMLError, ConfigTextError),
    )
    set_dumper(mode, dump_config)
    return mode


def config_parser(config_cls: type, prog: str | None = None, description: str | None = None) -> ArgumentParser:
    """A parser with one argument per setting of ``config_cls``, ``--config`` and ``--print-config``."""
    parser = ArgumentParser(
        prog=prog,
        description=description,
        exit_on_error=False,
        allow_abbrev=False,  # a misspelt flag (--max-new-byte) is refused, never taken for another
        print_config="--print-config",
        parser_mode=_yaml_mode(config_cls),
    )
    parser._negative_number_matcher = NEGATIVE_NUMBER
    parser.add_argument(
        "--config",
        action=ActionConfigFile,
        help="YAML or JSON file with any of the options below (flags win)",
    )
    for leaf in leaves(config_cls):
        _add_leaf(parser, leaf)
    return parser


def config_from_namespace(config_cls: type[T], namespace: Namespace) -> T:
    """The (nested) dataclass from a namespace that :func:`config_parser`'s parser produced, its ranges checked."""
    values = {leaf.name: namespace[leaf.name] for leaf in leaves(config_cls)}
    if problem := range_problem(config_cls, values):
        raise UserError(problem)
    return from_flat(config_cls, values)


def config_files_first(argv: Sequence[str]) -> list[str]:
    """``argv`` with every ``--config FILE`` moved to the front, so that flags win wherever they stand."""
    files: list[str] = []
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--config":
            files += [arg, next(args, "")]
        elif arg.startswith("--config="):
            files.append(arg)
        else:
            rest.append(arg)
    return files + rest


def error_line(error: Exception) -> str:
    """A parser error as one line (``jsonargparse`` explains type errors over several)."""
    return " ".join(str(error).split())
