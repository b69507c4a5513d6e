"""Typed dataclass configs that come from CLI flags or from a YAML/JSON file.

Each CLI declares one dataclass. :func:`add_config_arguments` turns its fields into flags
(help text from ``field(metadata={"help": ...})``); :func:`config_from_args` merges, in order of
precedence, explicit flags > the ``--config`` file > the dataclass defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

from distill.errors import UserError

T = TypeVar("T")


def _base_type(annotation: Any) -> tuple[type, bool]:
    """(scalar type, is_list) for an annotation such as ``int``, ``str | None``, ``list[str]``."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(args[0])
    if origin in (list, tuple):
        return typing.get_args(annotation)[0], True
    return annotation, False


def _parse_bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def add_config_arguments(parser: argparse.ArgumentParser, config_cls: type) -> None:
    """Add one flag per dataclass field, plus ``--config FILE``."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help="YAML or JSON file with any of the options below (flags given on the command line win)",
    )
    hints = typing.get_type_hints(config_cls)
    for field in dataclasses.fields(config_cls):
        base, is_list = _base_type(hints[field.name])
        flag = "--" + field.name.replace("_", "-")
        default = field.default if field.default is not dataclasses.MISSING else None
        if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = field.default_factory()  # type: ignore[misc]
        help_text = field.metadata.get("help", "")
        help_text = f"{help_text} (default: {default!r})" if default not in (None, [], "") else help_text
        kwargs: dict[str, Any] = {"dest": field.name, "default": argparse.SUPPRESS, "help": help_text}
        if "choices" in field.metadata:
            kwargs["choices"] = field.metadata["choices"]
        if base is bool:
            kwargs.update(type=_parse_bool, nargs="?", const=True, metavar="BOOL")
        elif is_list:
            kwargs.update(type=base, nargs="+")
        else:
            kwargs.update(type=base)
        if field.metadata.get("positional"):
            kwargs.pop("dest")
            kwargs["nargs"] = "?" if not is_list else "*"
            parser.add_argument(field.name, **kwargs)
        else:
            parser.add_argument(flag, **kwargs)


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML or JSON mapping of option names (``max_length`` or ``max-length``)."""
    if not path.is_file():
        raise UserError(f"config file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # noqa: BLE001 - any parse error is the user's file
        raise UserError(f"cannot parse config file {path}: {str(exc).splitlines()[0]}") from exc
    if not isinstance(data, dict):
        raise UserError(f"config file {path} must hold a mapping of option: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def config_from_args(config_cls: type[T], args: argparse.Namespace) -> T:
    """Build the dataclass from defaults < ``--config`` file < explicit flags."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    values: dict[str, Any] = {}
    if getattr(args, "config", None) is not None:
        from_file = load_config_file(args.config)
        unknown = sorted(set(from_file) - names)
        if unknown:
            raise UserError(f"unknown option(s) in {args.config}: {', '.join(unknown)}")
        values.update(from_file)
    values.update({k: v for k, v in vars(args).items() if k in names})
    missing = [
        f.name
        for f in dataclasses.fields(config_cls)
        if f.name not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING  # type: ignore[misc]
    ]
    if missing:
        flags = ", ".join("--" + m.replace("_", "-") for m in missing)
        raise UserError(f"missing required option(s): {flags}")
    return config_cls(**values)
