"""Benchmark of the command line's start-up (not a test): seconds from a fresh interpreter to the
end of ``bytedistill --help`` and of each ``bytedistill CMD --help``, and what ``import torch``
alone costs for comparison. Each figure is the median of ``--repeats`` fresh processes.

    python -m benchmarks.startup [--repeats 5] [--smoke] [--markdown]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from benchmarks.results import markdown_table, write_section

HELP = "import sys\nfrom bytedistill.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
HEAVY = ("torch", "transformers", "accelerate", "numba")


def seconds(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - start


def help_code(argv: list[str]) -> str:
    return HELP.format(argv=argv)


def heavy_modules_after(argv: list[str]) -> list[str]:
    """The heavy libraries a ``--help`` imported (none is wanted)."""
    probe = help_code(argv) + f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules), file=sys.stderr)\n"
    result = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    return result.stderr.split()


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per figure (the median is shown)")
    parser.add_argument("--smoke", action="store_true", help="one process per figure, two commands: a quick check")
    parser.add_argument("--markdown", action="store_true", help="write the table into docs/RESULTS.md")
    args = parser.parse_args()
    from bytedistill.cli import COMMANDS

    repeats = 1 if args.smoke else args.repeats
    commands = [[], *([name] for name in COMMANDS)][: 2 if args.smoke else None]
    rows = []
    for argv in commands:
        times = [seconds(help_code([*argv, "--help"])) for _ in range(repeats)]
        heavy = heavy_modules_after([*argv, "--help"])
        label = "bytedistill " + " ".join([*argv, "--help"])
        rows.append([f"`{label}`", f"{statistics.median(times):.2f}", ", ".join(heavy) or "none"])
        print(f"{label:<36} {statistics.median(times):6.2f} s   heavy imports: {', '.join(heavy) or 'none'}")
    torch_time = statistics.median(seconds("import torch") for _ in range(repeats))
    print(f"{'import torch (for comparison)':<36} {torch_time:6.2f} s")
    rows.append(["`python -c 'import torch'` (for comparison)", f"{torch_time:.2f}", "torch"])
    if args.markdown and not args.smoke:
        write_section("startup", markdown_table(["command", "seconds (median)", "heavy libraries imported"], rows))


if __name__ == "__main__":
    main()
