"""Training stores named on the Hub (``hf://datasets/OWNER/NAME[@REVISION]``, :mod:`logit_store.hub`):
each name becomes the Hub cache's store directory of one commit at a run's entry, and a resumed run
reads the commits its checkpoint's ``run_info.json`` pinned (``hub_stores``), so that it reads the
same bytes even if the repo moved on since."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from common.errors import UserError
from logit_store.hub import PREFIX, is_hub_name, parse_name, pinned_name, repo_of_snapshot, resolve

RUN_INFO_KEY = "hub_stores"  # run_info.json: repo id -> the pinned name, hf://datasets/OWNER/NAME@<commit>


def pins_of_checkpoint(checkpoint: Path | None) -> dict[str, str]:
    """The pinned names a checkpoint's run_info.json records (none for a fresh run or an older run)."""
    path = Path(checkpoint) / "run_info.json" if checkpoint is not None else None
    if path is None or not path.is_file():
        return {}
    try:
        pins = json.loads(path.read_text(encoding="utf-8")).get(RUN_INFO_KEY) or {}
    except (ValueError, OSError, AttributeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    return {repo: name for repo, name in pins.items() if isinstance(name, str) and is_hub_name(name)}


def local_name(name: str, pins: dict[str, str]) -> str:
    """The store directory for ``name``: a Hub name without a revision takes its pinned commit."""
    if not is_hub_name(name):
        return name
    repo = parse_name(name)
    if "@" not in name[len(PREFIX) :] and repo.repo_id in pins:
        name = pins[repo.repo_id]
    return str(resolve(name))


def with_hub_stores(config, resume_from: Path | None):
    """``config`` with its Hub store names (training and held-out) turned into store directories."""
    pins = pins_of_checkpoint(resume_from)
    train = [local_name(s, pins) for s in config.train_stores]
    held_out = local_name(config.eval_store, pins) if config.eval_store is not None else None
    return dataclasses.replace(config, train_stores=train, eval_store=held_out)


def hub_pins(directories: list[str]) -> dict[str, str]:
    """Repo id -> pinned name of each store directory that is a Hub copy (what run_info.json records)."""
    pins = {}
    for directory in directories:
        if (name := pinned_name(Path(directory))) is not None:
            pins[repo_of_snapshot(Path(directory)).repo_id] = name
    return pins
