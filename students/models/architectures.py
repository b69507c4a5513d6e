"""The registry of student architectures: every :class:`~students.models.architecture.Architecture`, by
name (``train --architecture``) and by ``model_type`` (what a saved ``config.json`` holds). Adding
an architecture is one module that defines it and one line in :data:`ARCHITECTURES`.

Importing it loads no torch: ``bytedistill train --help`` lists the names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.errors import UserError
from students.models.architecture import Architecture
from students.models.flat import FLAT
from students.models.patched import PATCHED

ARCHITECTURES: dict[str, Architecture] = {architecture.name: architecture for architecture in (FLAT, PATCHED)}
DEFAULT = FLAT  # what ``train`` builds without ``--architecture``


def architecture_named(name: str) -> Architecture:
    if name not in ARCHITECTURES:
        raise UserError(f"unknown student architecture {name!r}; choose one of {', '.join(ARCHITECTURES)}")
    return ARCHITECTURES[name]


def architecture_of_type(model_type: Any, where: object) -> Architecture:
    """The architecture whose config's ``model_type`` is ``model_type`` (``where``: the config, for the error)."""
    for architecture in ARCHITECTURES.values():
        if architecture.model_type == model_type:
            return architecture
    raise UserError(f"{where} holds a {model_type!r} model, not a bytedistill student")


def architecture_of_config(saved: Any, config_file: Path) -> Architecture:
    """The architecture of a checkpoint's or folder's ``config.json``, read as ``saved``."""
    return architecture_of_type(saved.get("model_type") if isinstance(saved, dict) else None, config_file)


def architecture_of_model(model) -> Architecture:
    return architecture_of_type(model.config.model_type, "the model's config")


def student_cost(model):
    """What ``model`` costs (:class:`students.models.cost.StudentCost`), whatever its architecture."""
    return architecture_of_model(model).cost(model)


def register_auto_classes() -> None:
    """Make ``AutoModelForCausalLM`` load every architecture's exported folder with this library's classes."""
    for architecture in ARCHITECTURES.values():
        architecture.register_auto_classes()


def known_auto_maps() -> list[dict[str, str] | None]:
    """The ``auto_map`` values an export writes into ``config.json`` (None: none written)."""
    written = (architecture.auto_map() for architecture in ARCHITECTURES.values())
    return [None, *(auto_map for auto_map in written if auto_map is not None)]
