"""What a teacher is, rather than where it sits: its name and a hash of its weights.

A store names its teacher by :func:`teacher_name` (a local teacher's file or folder name, a Hub id
as given) and identifies it by :func:`weights_hash`: SHA-256 over the weights files (a ``.gguf``
file; a folder's ``config.json`` and weights files, each with its name), streamed in chunks; for a
Hub id, the revision ``transformers`` loaded. The store's vocabulary hash completes the identity,
so a resume with a teacher of other weights at the same path (or a Hub id whose revision moved) is
refused (``docs/DESIGN.md``, "Store"). A local file's hash is cached under the user's cache folder
by (path, size, modification and change time, inode), so a resume does not read a large teacher
again; the cache is only a shortcut, never required.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")  # files whose bytes are weights
CHUNK = 1 << 24  # bytes read at once
CACHE_FILE = "bytedistill/weight-hashes.json"


def teacher_name(source: str, gguf_file: str | None = None) -> str:
    """A teacher's name in a store: a local teacher's file or folder name (``tiny.gguf``,
    ``SmolLM2-135M``, ``folder/model.gguf``), a Hub id as given."""
    path = Path(source)
    if not path.exists():
        return str(source)
    name = path.resolve().name
    return f"{name}/{gguf_file}" if gguf_file else name


def weights_files(model_source: str, gguf_file: str | None = None) -> list[Path]:
    """The local files whose bytes make the teacher's model: its GGUF file, or a folder's
    ``config.json`` and weights files (sorted); [] for a Hub id."""
    folder = Path(model_source)
    if gguf_file:
        return [folder / gguf_file]
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_file() and (p.suffix in WEIGHT_SUFFIXES or p.name == "config.json")]
    return sorted(found, key=lambda p: p.name)


def hub_revision(repo_id: str, filename: str = "config.json", cache_dir: str | None = None) -> str | None:
    """The revision (commit sha) of a Hub repository that a load just read from the local Hub
    cache: the snapshot folder its ``filename`` lies in; None when it is not cached."""
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir)
    except Exception:  # noqa: BLE001 - not a repository id, or no cache: no revision known
        return None
    parts = Path(path).parts if isinstance(path, str) else ()
    return parts[parts.index("snapshots") + 1] if "snapshots" in parts[:-1] else None


def weights_hash(model_source: str, gguf_file: str | None = None, revision: str | None = None) -> str | None:
    """``sha256:<hex>`` of a local teacher's weights files, ``hub:<revision>`` for a Hub id
    loaded at that revision, None when neither is known."""
    files = weights_files(model_source, gguf_file)
    if not files:
        return f"hub:{revision}" if revision else None
    digest = hashlib.sha256(b"bytedistill-teacher-weights-v1\0")
    for path in files:
        digest.update(path.name.encode() + b"\0" + bytes.fromhex(file_hash(path)))
    return f"sha256:{digest.hexdigest()}"


def file_hash(path: Path) -> str:
    """SHA-256 hex of a file's bytes, from the cache when the file is unchanged since."""
    stat = os.stat(path)
    key = f"{os.path.realpath(path)}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}|{stat.st_ino}"
    cache = _read_cache()
    if key in cache:
        return cache[key]
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    _write_cache(key, digest.hexdigest())
    return digest.hexdigest()


def _cache_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / CACHE_FILE


def _read_cache() -> dict[str, str]:
    try:
        cache = json.loads(_cache_path().read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    if not isinstance(cache, dict):
        return {}
    return {k: v for k, v in cache.items() if isinstance(v, str) and len(v) == 64}


def _write_cache(key: str, value: str) -> None:
    """Add one entry (best effort: a cache that cannot be written is not used)."""
    path = _cache_path()
    where = key.split("|", 1)[0]
    cache = {
        k: v for k, v in _read_cache().items() if k.split("|", 1)[0] != where and os.path.exists(k.split("|", 1)[0])
    }
    cache[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cache, indent=0, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        pass
