"""``bytedistill``: the command line, a thin layer over the library functions.

:data:`COMMANDS` maps each subcommand to a plain function that takes one typed dataclass config
(its parameter annotation) and returns the exit status; the function's docstring is the
subcommand's help (first line) and description (all of it). To add a subcommand, write the
dataclass and the function beside the code it drives and add one line to the table. A
:class:`UserError` or a mistake in the arguments becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import inspect
import re
import sys
import typing
from argparse import ArgumentError
from collections.abc import Callable

from jsonargparse import ArgumentParser

from bytedistill import (
    chat,
    check_teacher,
    dump,
    export,
    export_gguf,
    generate,
    push,
    score,
    serve,
    store,
    train,
)
from bytedistill.config import check_config_files, config_files_first, config_from_namespace, config_parser, error_line
from common import threads
from common.errors import UserError
from configs.fields import leaves
from configs.ranges import range_problem

# subcommand -> function(config) -> exit status, in the order a user meets them
COMMANDS: dict[str, Callable[[typing.Any], int]] = {
    "check-teacher": check_teacher.check_teacher,
    "dump": dump.dump,
    "inspect": store.inspect,
    "verify": store.verify,
    "train": train.train,
    "export": export.export,
    "export-gguf": export_gguf.export_gguf,
    "generate": generate.generate,
    "chat": chat.chat,
    "score": score.score,
    "push": push.push,
    "push-store": store.push_store,
    "serve": serve.serve,
}


def config_class(command: Callable[[typing.Any], int]) -> type:
    """The dataclass a command function takes: the annotation of its one parameter."""
    (parameter,) = inspect.signature(command).parameters
    return typing.get_type_hints(command)[parameter]


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="bytedistill",
        exit_on_error=False,
        allow_abbrev=False,  # a misspelt flag is refused, never taken for another
        description=(
            "Distil a token-level causal LM into a byte-level student: "
            "dump exact next-byte distributions, train a student on them, export and push it. "
            f"{threads.HELP}."
        ),
    )
    parser.add_argument("--version", action="store_true", help="print the version of bytedistill and exit")
    subcommands = parser.add_subcommands(dest="command", required=True)
    for name, command in COMMANDS.items():
        doc = inspect.getdoc(command) or ""
        sub = config_parser(config_class(command), prog=f"bytedistill {name}", description=f"{doc}\n\n{threads.HELP}.")
        own_mode = sub.parser_mode  # add_subcommand gives it the parent's; keep its own (lone values as lists)
        subcommands.add_subcommand(name, sub, help=doc.split("\n\n")[0].rstrip("."))
        sub.parser_mode = own_mode
    return parser


def _without_command_prefix(message: str, name: str | None) -> str:
    """Drop the ``dump.`` that jsonargparse puts before a subcommand's option names."""
    if name is None:
        return message
    fields = "|".join(leaf.name for leaf in leaves(config_class(COMMANDS[name])))
    return re.sub(rf"\b{re.escape(name)}\.(?=({fields})\b)", "", message)


def _printing_config(args: list[str]) -> list[str]:
    """``args`` without ``--print-config``: what the run it prints would parse."""
    return [arg for arg in args if arg != "--print-config" and not arg.startswith("--print-config=")]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        build_parser().print_help(sys.stderr)
        return 2
    if argv == ["--version"]:
        print(f"bytedistill {version()}")
        return 0
    name = argv[0] if argv and argv[0] in COMMANDS else None
    prefix = f"bytedistill {name}" if name else "bytedistill"
    try:
        check_config_files(argv[1:])
        args = [*argv[:1], *config_files_first(argv[1:])]
        if name is not None and _printing_config(args) != args:  # --print-config: the ranges a run checks
            printed = build_parser().parse_args(_printing_config(args))
            config_cls = config_class(COMMANDS[name])
            if problem := range_problem(
                config_cls, {leaf.name: printed[name][leaf.name] for leaf in leaves(config_cls)}
            ):
                raise UserError(problem)
        namespace = build_parser().parse_args(args)
    except (ArgumentError, UserError) as exc:
        print(f"{prefix}: error: {_without_command_prefix(error_line(exc), name)}", file=sys.stderr)
        return 2
    name = namespace.command
    command = COMMANDS[name]
    try:
        config = config_from_namespace(config_class(command), namespace[name])
        threads.set_threads(getattr(config, "threads", None))  # a command's own --threads wins
        status = int(command(config) or 0)
        sys.stdout.flush()  # here, so that a closed pipe is met while it can be handled
        return status
    except UserError as exc:
        print(f"bytedistill {name}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `bytedistill inspect STORE | head -1`: the reader has what it wanted
        _silence_stdout()
        return 141  # as a process that SIGPIPE ended
    except OSError as exc:  # a folder it may not write, a full disk, a file-size limit
        print(f"bytedistill {name}: error: {os_error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bytedistill {name}: interrupted", file=sys.stderr)
        return 130


def version() -> str:
    """The installed distribution's version ("unknown" where the package is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed_version

    try:
        return installed_version("bytedistill")
    except PackageNotFoundError:
        return "unknown (not installed)"


def os_error_line(exc: OSError) -> str:
    """An operating system's refusal as one line: what, where, and the system's words."""
    where = exc.filename if exc.filename is not None else None
    words = exc.strerror or str(exc)
    return f"{where}: {words}" if where is not None else f"{words} (errno {exc.errno})"


def _silence_stdout() -> None:
    """Point standard output at /dev/null, so that flushing it at exit does not fail again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())
