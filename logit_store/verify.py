"""Verifying a store: every chunk's checksum read, every document decoded, every distribution
normalised (what ``bytedistill verify`` reports)."""

from __future__ import annotations

import time

import numpy as np

from common.errors import UserError
from logit_store.integrity import read_completion
from logit_store.reader import LogitStore


def verify_store(store: LogitStore, tolerance: float = 1e-3) -> dict:
    """Read every chunk and decode every document; raise :class:`UserError` at the first problem."""
    start = time.time()
    positions = 0
    worst = 0.0
    chunks = store.check_chunks()
    for i in range(len(store)):
        doc = store.document(i)
        sums = (
            np.add.reduceat(doc.values.astype(np.float64), doc.layout.offsets[:-1]) if len(doc.values) else np.zeros(0)
        )
        err = float(np.abs(sums - 1).max()) if len(sums) else 0.0
        if not np.all(np.isfinite(doc.values)) or err > tolerance or (len(doc.values) and doc.values.min() < 0):
            shard, local = store.document_location(i)
            raise UserError(
                f"shard {shard} document {local} (store document {i}): distributions "
                f"not normalised (max |sum - 1| = {err:.3g} > {tolerance})"
            )
        if len(doc.dropped_mass) != len(doc.token_ids) + 1:
            raise UserError(f"document {i}: dropped mass has the wrong length (corrupt)")
        positions += doc.num_positions
        worst = max(worst, err)
    return {
        "ok": True,
        "encoding_kl_bits_per_position": _encoding_kl(store, positions),
        "shards": len(store.shards),
        "chunks": chunks,
        "documents": len(store),
        "unfinished_writers": store.unfinished_writers,
        "missing_writers": store.missing_writers,
        "positions": positions,
        "stream": store.stream.value,
        "max_normalisation_error": worst,
        "seconds": round(time.time() - start, 3),
    }


def _encoding_kl(store: LogitStore, positions: int) -> float | None:
    """The mean KL(exact || stored) in bits per position that the store's writers recorded when
    they finished; None where one did not (unfinished, or written before the records held it)."""
    if store.writer_states or not positions:
        return None
    records = [
        read_completion(store.directory, w) for w in sorted({s.record.writer_id for s in store.shards if s.record})
    ]
    if not records or any(r is None or r.kl_bits is None for r in records):
        return None
    return sum(r.kl_bits for r in records) / positions
