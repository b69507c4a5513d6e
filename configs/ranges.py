"""The values a numeric config field accepts: a :class:`Range` in the field's ``range`` metadata.

Library configs declare their ranges here, and :func:`range_problem` says, in one line naming the
flag, which value lies outside one: the command line refuses it when it parses, a library config
when it is built; a composed config's ranges are its settings' (:mod:`configs.fields`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from configs.fields import leaves


@dataclass(frozen=True)
class Range:
    """The values a numeric field accepts: above ``low`` and below ``high`` (None: unbounded), each
    bound itself included unless ``low_open`` / ``high_open``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'greater than' if self.low_open else 'at least'} {_number(self.low)}")
        if self.high is not None:
            parts.append(f"{'less than' if self.high_open else 'at most'} {_number(self.high)}")
        return " and ".join(parts)


def _number(bound: float) -> str:
    """A bound as written: an integer in full (4294967295, not 4.29497e+09), a fraction short."""
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e18 else f"{bound:g}"


def at_least(low: float) -> Range:
    return Range(low)


def above(low: float) -> Range:
    return Range(low, low_open=True)


POSITIVE = above(0)  # a real number > 0 (a rate, a temperature)
COUNT = at_least(1)  # a size or a count of something that must exist
NON_NEGATIVE = at_least(0)  # 0 usually means "off" or "all" (the field's help says which)
FRACTION = Range(0.0, 1.0)
SEED = Range(0, 2**32 - 1)  # what numpy's seeding accepts
LARGEST_INT = 2**63 - 1  # what an integer setting may be at most, whatever its range: a C long holds it


def flag_name(field_name: str) -> str:
    """The command-line flag of a config field (``max_length`` -> ``--max-length``)."""
    return "--" + field_name.replace("_", "-")


def range_problem(config_cls: type, values: dict[str, Any]) -> str | None:
    """The first numeric value outside its setting's ``range``, as a one-line message naming the
    flag (None if there is none); ``values`` by flat name. NaN and infinities are out of every
    range: a flag cannot give them, and a YAML file's ``.nan`` compares false with every bound
    (``grad_clip: .nan`` would turn clipping off). So is an integer past 64 bits, which torch,
    numpy and the standard library's C code cannot take (``num_layers: 1180591620717411303424``)."""
    for leaf in leaves(config_cls):
        allowed, value = leaf.field.metadata.get("range"), values.get(leaf.name)
        if allowed is None or value is None or isinstance(value, bool):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            return f"{flag_name(leaf.name)} must be a finite number ({allowed}), got {value}"
        if isinstance(value, int) and abs(value) > LARGEST_INT:
            return f"{flag_name(leaf.name)} must be at most {LARGEST_INT} (a 64-bit integer), got {value}"
        if value not in allowed:
            return f"{flag_name(leaf.name)} must be {allowed}, got {value}"
    return None
