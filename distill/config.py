"""Typed dataclass configs that come from CLI flags, a YAML/JSON file, or both.

Each command declares one plain dataclass; :func:`config_parser` turns its fields into a
``jsonargparse`` parser, which coerces every value to the field's type (from flags and from files
alike: ``lr: 3e-4`` in YAML is a float), refuses unknown keys, reads ``--config FILE`` (flags win,
wherever they stand) and writes a run's full config with ``--print-config``. Field metadata drives the
rest: ``help`` (the ``--help`` text), ``choices``, and ``positional`` (an argument without a flag).
Flags are the field names with dashes (``max_length`` -> ``--max-length``); a file may spell keys
either way, and may give a list field one value without brackets (``train_stores: a`` is ``[a]``).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from argparse import ArgumentError
from collections.abc import Sequence
from typing import Any, TypeVar

from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, get_loader, set_loader

from distill.errors import UserError

T = TypeVar("T")


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


def _add_field(parser: ArgumentParser, field: dataclasses.Field, annotation: Any) -> None:
    """One argument for one field; lists take space-separated values (``--end-of-text a b``)."""
    if "choices" in field.metadata:  # a Literal, so that --help names the choices, not a wrapper
        annotation = typing.Literal[tuple(field.metadata["choices"])]
    kwargs: dict[str, Any] = {"help": field.metadata.get("help"), "type": annotation}
    item_type = _list_item_type(annotation)
    if item_type is not None:
        kwargs.update(type=item_type, nargs="+")
    elif annotation is bool:
        kwargs.update(nargs="?", const=True)  # `--flag` alone means true; `--flag false` too
    default = _field_default(field)
    if field.metadata.get("positional") and default is dataclasses.MISSING:
        parser.add_argument(field.name, **kwargs)
    elif field.metadata.get("positional"):
        kwargs["nargs"] = "*" if item_type is not None else "?"
        parser.add_argument(field.name, default=default, **kwargs)
    elif default is dataclasses.MISSING:
        parser.add_argument("--" + field.name.replace("_", "-"), required=True, **kwargs)
    else:
        parser.add_argument("--" + field.name.replace("_", "-"), default=default, **kwargs)


def _scalars_as_lists(loaded: Any, list_keys: frozenset[str]) -> Any:
    """A loaded config mapping with a lone value under a list field's key made a one-item list."""
    if not isinstance(loaded, dict):
        return loaded
    return {
        k: [v] if k.replace("-", "_") in list_keys and not isinstance(v, list) and v is not None else v
        for k, v in loaded.items()
    }


def _yaml_mode(config_cls: type, hints: dict[str, Any]) -> str:
    """A ``jsonargparse`` parser mode: its YAML loader, but a lone value for a list field is a one-item list."""
    mode = f"yaml:{config_cls.__module__}.{config_cls.__qualname__}"
    list_keys = frozenset(f.name for f in dataclasses.fields(config_cls) if _list_item_type(hints[f.name]))
    yaml_load = get_loader("yaml")
    set_loader(mode, lambda text: _scalars_as_lists(yaml_load(text), list_keys))
    return mode


def config_parser(config_cls: type, prog: str | None = None, description: str | None = None) -> ArgumentParser:
    """A parser with one argument per field of ``config_cls``, ``--config`` and ``--print-config``."""
    hints = typing.get_type_hints(config_cls)
    parser = ArgumentParser(
        prog=prog,
        description=description,
        exit_on_error=False,
        print_config="--print-config",
        parser_mode=_yaml_mode(config_cls, hints),
    )
    parser.add_argument(
        "--config",
        action=ActionConfigFile,
        help="YAML or JSON file with any of the options below (flags win)",
    )
    for field in dataclasses.fields(config_cls):
        _add_field(parser, field, hints[field.name])
    return parser


def config_from_namespace(config_cls: type[T], namespace: Namespace) -> T:
    """The dataclass from a namespace that :func:`config_parser`'s parser produced."""
    return config_cls(**{f.name: namespace[f.name] for f in dataclasses.fields(config_cls)})


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


def parse_config(config_cls: type[T], argv: Sequence[str]) -> T:
    """Parse ``argv`` (flags, ``--config FILE``) into ``config_cls``; a mistake is a :class:`UserError`."""
    parser = config_parser(config_cls)
    try:
        namespace = parser.parse_args(config_files_first(argv))
    except ArgumentError as exc:
        raise UserError(error_line(exc)) from exc
    return config_from_namespace(config_cls, namespace)
