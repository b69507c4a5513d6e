"""What a dump's settings settle to at its entry (:class:`DumpPlan`): every ``auto`` and every value
derived from the settings and the store it resumes, worked out once, before the teacher loads, and
read by every step after. The store it resumes is read once here: its files are checked to be a
store's and its manifest read (:func:`existing_manifest`); the steps after read ``DumpPlan.manifest``.

Importing it loads no torch (the device is any object with a ``type``: ``cpu``, ``cuda``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from bytestream.stream_kind import AUTO_STREAM, StreamKind
from distill.dump.config import DumpConfig
from distill.dump.sharding import writers_of
from distill.teacher.windows import Reading

DEVICE_ENCODE_THREADS = 4  # a store writer's encoder threads by default where the device converts


@dataclass(frozen=True)
class DumpPlan:
    """A dump's settings, settled: ``config`` with its ``stream`` settled too, and what follows from it."""

    config: DumpConfig
    manifest: dict | None  # the manifest of the store it resumes, read once (None: no store there yet)
    stream: StreamKind  # --stream; for auto the stream of the store it resumes, else fused
    worker: int  # this worker among ``workers`` (processes × --num-shards)
    workers: int
    writers: int  # the store's fixed writer count: --writers, the store's own on resume, else the workers
    mine: tuple[int, ...]  # the writers this worker runs
    on_device: bool  # convert on the teacher's device (else with Numba on the CPU, beside the forward)
    chunk_bytes: int  # raw bytes of a store chunk: --chunk-bytes, else the encoding's
    encode_threads: int  # --encode-threads, else DEVICE_ENCODE_THREADS on the device path and 1 on the host's

    @property
    def reading(self) -> Reading:
        """How the teacher reads the documents into the store's rows (recorded in its manifest)."""
        return Reading(self.stream, self.config.windows.max_length, self.config.windows.stride)


def settle(config: DumpConfig, device, worker: int = 0, workers: int = 1) -> DumpPlan:
    """The plan of worker ``worker`` of ``workers`` whose teacher runs on ``device``."""
    from logit_store.encodings import get_encoding

    manifest = existing_manifest(config.output)
    stream = store_stream(config, manifest)
    writers = store_writers(config, workers, manifest)
    on_device = config.batching.conversion == "torch" or (
        config.batching.conversion == "auto" and device.type == "cuda"
    )
    return DumpPlan(
        config=replace(config, store=replace(config.store, stream=stream.value)),
        manifest=manifest,
        stream=stream,
        worker=worker,
        workers=workers,
        writers=writers,
        mine=tuple(writers_of(worker, workers, writers)),
        on_device=on_device,
        chunk_bytes=config.store.chunk_bytes or get_encoding(config.store.encoding).chunk_bytes,
        encode_threads=config.store.encode_threads or (DEVICE_ENCODE_THREADS if on_device else 1),
    )


def existing_manifest(output: str) -> dict | None:
    """The manifest of the store at ``output`` (None where there is none yet), after refusing a file
    there with a store's name that no store writer wrote (a refusal before the teacher loads is quick)."""
    from logit_store.file_names import MANIFEST
    from logit_store.manifest import read_manifest
    from logit_store.ownership import check_store_files

    check_store_files(Path(output))
    return read_manifest(Path(output)) if (Path(output) / MANIFEST).is_file() else None


def store_stream(config: DumpConfig, manifest: dict | None) -> StreamKind:
    """The stream the dump writes: ``--stream``, or for ``auto`` the stream of the store it resumes
    (its ``manifest``), else fused (the default: docs/DESIGN.md, "The fused stream")."""
    from logit_store.manifest import manifest_stream

    if config.store.stream != AUTO_STREAM:
        return StreamKind(config.store.stream)
    if manifest is not None:
        return manifest_stream(manifest)
    return StreamKind.FUSED


def store_writers(config: DumpConfig, workers: int, manifest: dict | None) -> int:
    """The store's fixed writer count: given, recorded in the store it resumes (its ``manifest``), or
    the workers now."""
    if config.store.writers is not None:
        return config.store.writers
    if manifest is not None:
        recorded = manifest.get("settings", {}).get("writers")
        if isinstance(recorded, int) and recorded > 0:
            return recorded
    return workers
