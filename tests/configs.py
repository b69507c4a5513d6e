"""A config parsed from a command line, as the router parses a subcommand's arguments."""

from __future__ import annotations

from argparse import ArgumentError
from collections.abc import Sequence
from typing import TypeVar

from bytedistill.config import check_config_files, config_files_first, config_from_namespace, config_parser, error_line
from common.errors import UserError

T = TypeVar("T")


def parse_config(config_cls: type[T], argv: Sequence[str]) -> T:
    """Parse ``argv`` (flags, ``--config FILE``) into ``config_cls``; a mistake is a :class:`UserError`."""
    parser = config_parser(config_cls)
    check_config_files(argv)
    try:
        namespace = parser.parse_args(config_files_first(argv))
    except ArgumentError as exc:
        raise UserError(error_line(exc)) from exc
    return config_from_namespace(config_cls, namespace)
