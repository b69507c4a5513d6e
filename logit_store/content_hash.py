"""A hash of a store's documents that does not depend on how they are sharded (FORMAT.md, "Content hash")."""

from __future__ import annotations

import hashlib
import json
import struct

import numpy as np

from logit_store.multi import MultiStore, as_store


def store_content_hash(directory_or_store) -> str:
    """SHA-256 over the vocabulary hash, the encoding, and every stored document in order
    (its counts, token ids, encoded values, dropped mass, text bytes and key): independent of
    how documents are split into shards and chunks, and of the compression level."""
    store = as_store(directory_or_store)
    stores = store.stores if isinstance(store, MultiStore) else [store]
    h = hashlib.sha256(b"bytedistill-store-content-v1\0")
    h.update(store.vocab_hash.encode())
    for s in stores:
        h.update(json.dumps(s.encoding.describe(), sort_keys=True).encode())
    for i in range(len(store)):
        d = store.encoded_document(i)
        key = None if d.key is None else d.key.encode("utf-8")
        h.update(
            struct.pack(
                "<QQQQq",
                len(d.token_ids),
                len(d.value_bytes),
                d.num_positions,
                d.text_bytes,
                -1 if key is None else len(key),
            )
        )
        for part in (d.token_ids.astype("<u4"), d.value_bytes, d.position_bytes, d.dropped_mass.astype("<f4")):
            h.update(np.ascontiguousarray(part).tobytes())
        h.update(key or b"")
        if d.roles is not None:  # a chat store's roles (a store of plain text hashes as before)
            h.update(np.ascontiguousarray(d.roles, np.uint8).tobytes())
    return h.hexdigest()
