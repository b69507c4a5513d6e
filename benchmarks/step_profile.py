"""Where the time of one decode step goes: the flat student's batch-1 step, as the engine runs it
eagerly (``students/serving/flat_step.py``), broken down by ``torch.profiler``.

For each size (the serving benchmark's flat students, random weights: speed depends on shapes) and
batch, on the threads given: the step's median wall time (no profiler), the number of ATen
operators it dispatches (nested ones included), and under the profiler (which slows every
operator call, so these are shares, not the plain step's times) the step's wall time and the
operators' own CPU time (self time, children left out) grouped by what they do: matrix products,
attention, the cache write and read (index and index_put), casts and copies, views, elementwise
(norms, rotary embedding, activations) and the rest; what the operators' own time leaves of the
profiled wall time is Python and module calls above the operators. Beside the step: the same
matrix products alone (the step's weights, one product each, timed in a loop without the
profiler), the floor that a step free of everything else would reach; the step less that floor,
per operator, is what one operator call costs in the plain step. A line starting ``summary``
closes the table.

    python -m benchmarks.step_profile [--markdown]           # sizes S and M, batch 1 and 8, 1 thread
    python -m benchmarks.step_profile --threads 2
    python -m benchmarks.step_profile --smoke
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.generation import SIZES, SMOKE_SIZES, Shape, flat_student
from benchmarks.results import markdown_table, write_section
from students.serving.flat_step import FlatStepper

CONTEXT = 64  # symbols each row has read before the timed steps
GROUPS = ("matrix products", "attention", "cache index", "casts and copies", "views", "elementwise", "other")
MATMUL_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"}
CACHE_OPS = {"aten::index", "aten::index_put_", "aten::_index_put_impl_", "aten::index_put"}
COPY_OPS = {"aten::_to_copy", "aten::to", "aten::copy_", "aten::clone", "aten::contiguous", "aten::empty_strided"}
VIEW_OPS = {
    "aten::view",
    "aten::transpose",
    "aten::unsqueeze",
    "aten::slice",
    "aten::select",
    "aten::as_strided",
    "aten::t",
    "aten::expand",
    "aten::reshape",
    "aten::_reshape_alias",
    "aten::_unsafe_view",
    "aten::squeeze",
    "aten::alias",
    "aten::detach",
}
ELEMENTWISE_OPS = {
    "aten::mul",
    "aten::add",
    "aten::sub",
    "aten::neg",
    "aten::pow",
    "aten::mean",
    "aten::rsqrt",
    "aten::silu",
    "aten::cat",
    "aten::cos",
    "aten::sin",
    "aten::le",
    "aten::arange",
    "aten::embedding",
    "aten::index_select",
}


def group_of(op: str) -> str:
    """Which group of :data:`GROUPS` an ATen operator's own time counts in."""
    if op in MATMUL_OPS:
        return "matrix products"
    if "attention" in op:
        return "attention"
    for group, ops in (
        ("cache index", CACHE_OPS),
        ("casts and copies", COPY_OPS),
        ("views", VIEW_OPS),
        ("elementwise", ELEMENTWISE_OPS),
    ):
        if op in ops:
            return group
    return "other"


@dataclass
class Profile:
    size: str
    batch: int
    threads: int
    step_ms: float  # median wall time of a step, no profiler
    ops: float  # ATen operators per step (top level and nested)
    profiled_ms: float  # wall time of a step under the profiler
    group_ms: dict[str, float]  # own CPU time per step by group (under the profiler)
    matmul_floor_ms: float  # the step's matrix products alone

    @property
    def op_ms(self) -> float:
        return sum(self.group_ms.values())

    def share(self, group: str) -> float:
        """A group's share of the profiled step's wall time."""
        return self.group_ms[group] / self.profiled_ms

    @property
    def above_ops_share(self) -> float:
        """The share of the profiled wall time outside the operators' own time: Python, module calls."""
        return max(self.profiled_ms - self.op_ms, 0.0) / self.profiled_ms

    @property
    def per_op_us(self) -> float:
        """What one operator call costs in the plain step: the step less its matrix products alone, per operator."""
        return 1000 * max(self.step_ms - self.matmul_floor_ms, 0.0) / max(self.ops, 1)


class StepRun:
    """A stepper with ``batch`` rows that have read :data:`CONTEXT` symbols, and its next step."""

    def __init__(self, model, batch: int):
        self.stepper = FlatStepper(model, slots=batch, device=torch.device("cpu"))
        generator = torch.Generator().manual_seed(0)
        for slot in range(batch):
            self.stepper.prefill(slot, torch.randint(0, 256, (CONTEXT,), generator=generator).tolist())
        self.symbols = torch.randint(0, 256, (batch,), generator=generator)
        self.positions = torch.full((batch,), CONTEXT, dtype=torch.long)

    @torch.no_grad()
    def __call__(self) -> torch.Tensor:
        return self.stepper.step(self.symbols, self.positions, CONTEXT + 1).argmax(-1)


def median_ms(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def profiled_groups(run, steps: int) -> tuple[float, float, dict[str, float]]:
    """(operators per step, wall ms per step, own CPU ms per step by group) over ``steps`` profiled steps."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            run()
        wall = 1000 * (time.perf_counter() - start) / steps
    groups: dict[str, float] = defaultdict(float)
    calls = 0
    for event in prof.key_averages():
        if not event.key.startswith("aten::"):
            continue
        groups[group_of(event.key)] += event.self_cpu_time_total / 1000 / steps
        calls += event.count
    return calls / steps, wall, {group: groups.get(group, 0.0) for group in GROUPS}


@torch.no_grad()
def matmul_floor_ms(model, batch: int, repeats: int) -> float:
    """The step's matrix products alone: every linear layer's weight times a (batch, in) input."""
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(batch, w.shape[1]) for w in weights]

    def products():
        for x, w in zip(inputs, weights):
            torch.mm(x, w.t())

    return median_ms(products, repeats)


def measure(size: Shape, batch: int, threads: int, repeats: int, profiled: int) -> Profile:
    torch.set_num_threads(threads)
    model = flat_student(size)
    run = StepRun(model, batch)
    for _ in range(max(repeats // 10, 3)):  # warm caches and allocator
        run()
    step = median_ms(run, repeats)
    ops, profiled_ms, groups = profiled_groups(run, profiled)
    return Profile(size.name, batch, threads, step, ops, profiled_ms, groups, matmul_floor_ms(model, batch, repeats))


def table(rows: list[Profile]) -> str:
    header = [
        "student",
        "batch",
        "threads",
        "step ms",
        "ATen ops/step",
        "profiled step ms",
        *[f"{g} %" for g in GROUPS],
    ]
    header += ["above the ops %", "matrix products alone ms", "µs per op call"]
    body = [
        [
            f"flat {r.size}",
            str(r.batch),
            str(r.threads),
            f"{r.step_ms:.3f}",
            f"{r.ops:.0f}",
            f"{r.profiled_ms:.3f}",
            *[f"{100 * r.share(g):.0f}" for g in GROUPS],
            f"{100 * r.above_ops_share:.0f}",
            f"{r.matmul_floor_ms:.3f}",
            f"{r.per_op_us:.2f}",
        ]
        for r in rows
    ]
    return markdown_table(header, body)


def summary(rows: list[Profile]) -> str:
    first = rows[0]
    heavy = first.share("matrix products") + first.share("attention")
    return (
        f"summary: flat {first.size} batch {first.batch} step {first.step_ms:.3f} ms, {first.ops:.0f} ATen ops: "
        f"matrix products and attention {100 * heavy:.0f}% of the profiled step, Python above the operators "
        f"{100 * first.above_ops_share:.0f}%; the matrix products alone {first.matmul_floor_ms:.3f} ms "
        f"({first.step_ms / max(first.matmul_floor_ms, 1e-9):.1f}x less than the step), {first.per_op_us:.2f} µs "
        "per operator call for the rest"
    )


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the step")
    parser.add_argument("--sizes", type=int, default=2, help="how many of the serving benchmark's sizes (S, M, L)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="batch sizes to profile")
    parser.add_argument("--repeats", type=int, default=400, help="timed steps per row (the median is reported)")
    parser.add_argument("--profiled", type=int, default=100, help="steps under the profiler per row")
    parser.add_argument("--markdown", action="store_true", help="write the table to docs/RESULTS.md")
    parser.add_argument("--smoke", action="store_true", help="toy sizes and few steps (a test)")
    args = parser.parse_args()
    sizes = (SMOKE_SIZES if args.smoke else SIZES)[: args.sizes]
    repeats, profiled = (20, 5) if args.smoke else (args.repeats, args.profiled)
    rows = [measure(size, batch, args.threads, repeats, profiled) for size in sizes for batch in args.batches]
    text = table(rows) + "\n\n" + summary(rows)
    print(text)
    if args.markdown and not args.smoke:
        write_section("step-profile", text)


if __name__ == "__main__":
    main()
