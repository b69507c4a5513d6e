"""The settings of a composed config, flat: one name per setting, whatever group declares it.

A config dataclass may hold other config dataclasses, each declared by the module that reads
it (the trainer's config holds the student's shape, the optimiser's settings, ...). Its
settings are the leaves: the fields that are not dataclasses, in declaration order, depth first.
A leaf's name is its field's name, or the ``flag`` in its metadata where the owner's name for it
is not the one users know (``CorpusSpec.source`` is ``corpus``). No two leaves share a name, so
the flat names are the command line's flags and a config file's keys, and :func:`flat_values`
(what ``--print-config`` writes, run_info.json keeps and TensorBoard shows) and :func:`from_flat`
(the nested config built back, each group from its own names) are inverses.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Leaf:
    """One setting: its flat name, the attributes that lead to it, and its declaration."""

    name: str  # the flag's key: max_length for --max-length
    path: tuple[str, ...]  # attribute names from the config down to the value: ("optim", "lr")
    field: dataclasses.Field  # the declaration: help, choices, range, default
    annotation: Any  # its resolved type


def _fields(config_cls: type) -> list[tuple[dataclasses.Field, Any]]:
    """The fields of ``config_cls`` with their resolved types (a dataclass type: a group)."""
    hints = typing.get_type_hints(config_cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(config_cls)]


def _flat_name(field: dataclasses.Field) -> str:
    return field.metadata.get("flag", field.name)


@functools.cache
def leaves(config_cls: type) -> tuple[Leaf, ...]:
    """The settings of ``config_cls``, in declaration order, depth first; refuses two of one name."""
    found: list[Leaf] = []
    for field, annotation in _fields(config_cls):
        if dataclasses.is_dataclass(annotation):
            found += [dataclasses.replace(leaf, path=(field.name, *leaf.path)) for leaf in leaves(annotation)]
        else:
            found.append(Leaf(_flat_name(field), (field.name,), field, annotation))
    names = [leaf.name for leaf in found]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise TypeError(f"{config_cls.__name__}: two settings named {', '.join(twice)}")
    return tuple(found)


def flat_values(config: Any) -> dict[str, Any]:
    """``config``'s settings by flat name, in declaration order."""
    values = {}
    for leaf in leaves(type(config)):
        value = config
        for name in leaf.path:
            value = getattr(value, name)
        values[leaf.name] = value
    return values


def from_flat(config_cls: type[T], values: Mapping[str, Any]) -> T:
    """The nested ``config_cls`` whose settings are ``values`` (by flat name; a setting not given
    takes its default); a name that is not a setting of ``config_cls`` is a TypeError."""
    unknown = set(values) - {leaf.name for leaf in leaves(config_cls)}
    if unknown:
        raise TypeError(f"{config_cls.__name__} has no setting {', '.join(sorted(unknown))}")
    return _build(config_cls, values)


def _build(config_cls: type[T], values: Mapping[str, Any]) -> T:
    kwargs = {}
    for field, annotation in _fields(config_cls):
        if dataclasses.is_dataclass(annotation):
            kwargs[field.name] = _build(annotation, values)
        elif _flat_name(field) in values:
            kwargs[field.name] = values[_flat_name(field)]
    return config_cls(**kwargs)
