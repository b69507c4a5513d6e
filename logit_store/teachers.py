"""Which teacher a store was dumped from, as its manifest records it, and stores of two teachers refused.

A manifest names its teacher (``teacher``) and what the teacher's weights are (``teacher_hash``:
``sha256:`` of a local teacher's weights files, ``hub:`` and the revision of a Hub id). Two stores of
one vocabulary may still come from two teachers (a fine-tune, another seed of a model): read together,
or one as the held-out store of the other, the distributions and every teacher figure would mix
them. Two stores are of different teachers when both record a hash of the same kind and the hashes
differ; stores written before the hash was recorded, or hashes of two kinds (a local copy of a Hub
model), cannot be told apart and are taken as one teacher.
"""

from __future__ import annotations

from pathlib import Path

from common.errors import UserError


def teacher_hash(manifest: dict) -> str | None:
    value = manifest.get("teacher_hash")
    return value if isinstance(value, str) and ":" in value else None


def different_teachers(first: dict, other: dict) -> bool:
    """Whether two manifests record teachers that are known to differ."""
    a, b = teacher_hash(first), teacher_hash(other)
    if a is None or b is None or a.split(":", 1)[0] != b.split(":", 1)[0]:
        return False
    return a != b


def described(manifest: dict) -> str:
    """The teacher as one line names it: its name and the start of its hash."""
    name = manifest.get("teacher") or "unknown"
    value = teacher_hash(manifest)
    return f"teacher {name}, {value[:19]}…" if value else f"teacher {name}"


def refuse_other_teachers(stores: list[tuple[Path | str, dict]]) -> None:
    """Refuse stores (path, manifest) whose teachers differ from the first one's, naming both."""
    if not stores:
        return
    first_path, first = stores[0]
    for path, manifest in stores[1:]:
        if different_teachers(first, manifest):
            raise UserError(
                f"the stores {first_path} ({described(first)}) and {path} ({described(manifest)}) were dumped "
                "from different teachers: train and evaluate on stores of one teacher"
            )
