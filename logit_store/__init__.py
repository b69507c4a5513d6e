"""The logit store: compressed, checksummed shards of exact next-byte distributions.

See ``logit_store/FORMAT.md`` for the on-disk format and ``docs/DESIGN.md``, "Store", for the motivation.

The names below are imported from their modules when first used (``logit_store.LogitStore``), so
that importing one module of the package (``logit_store.encodings``, whose encoding names a config's
choices read) loads no Numba and no reader.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "DEFAULT_ENCODING": "logit_store.encodings",
    "ENCODINGS": "logit_store.encodings",
    "get_encoding": "logit_store.encodings",
    "kl_bits_per_position": "logit_store.encodings",
    "FORMAT_VERSION": "logit_store.manifest",
    "LogitStore": "logit_store.reader",
    "MultiStore": "logit_store.multi",
    "StoredDocument": "logit_store.reader",
    "StoreWriter": "logit_store.writer",
    "StoreIdentity": "logit_store.identity",
    "open_stores": "logit_store.multi",
    "store_content_hash": "logit_store.content_hash",
}

__all__ = [  # each imported from its module on first use (__getattr__)
    "DEFAULT_ENCODING",
    "ENCODINGS",
    "FORMAT_VERSION",
    "LogitStore",
    "MultiStore",
    "StoreIdentity",
    "StoreWriter",
    "StoredDocument",
    "get_encoding",
    "kl_bits_per_position",
    "open_stores",
    "store_content_hash",
]


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'logit_store' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES))
