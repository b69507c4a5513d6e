"""``bytedistill``: the command line, a thin layer over the library functions.

Each subcommand lives beside the code it drives and exposes ``register(subparsers)``, which adds
its parser and sets ``handler`` to a function taking the parsed arguments. A :class:`UserError`
becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from distill.errors import UserError

# subcommand -> module that registers it, in the order a user meets them
SUBCOMMANDS = {
    "dump": "distill.dump_cli",
    "inspect": "logit_store.cli",
    "verify": "logit_store.cli",
    "train": "students.train_cli",
    "export": "students.export_cli",
    "generate": "students.export_cli",
    "score": "students.export_cli",
    "push": "students.export_cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bytedistill",
        description=(
            "Distil a token-level causal LM into a byte-level student: "
            "dump exact next-byte distributions, train a student on them, export and push it."
        ),
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in dict.fromkeys(SUBCOMMANDS.values()):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue  # not built yet
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    try:
        result = args.handler(args)
    except UserError as exc:
        print(f"bytedistill {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"bytedistill {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
