"""The logit store: compressed, checksummed shards of exact next-byte distributions.

See ``logit_store/FORMAT.md`` for the on-disk format and ``docs/DESIGN.md``, "Store", for the motivation.
"""

from logit_store.encodings import (
    DEFAULT_ENCODING,
    ENCODINGS,
    get_encoding,
    kl_bits_per_position,
)
from logit_store.manifest import FORMAT_VERSION
from logit_store.store import (
    LogitStore,
    MultiStore,
    StoredDocument,
    StoreWriter,
    open_stores,
    store_content_hash,
)

__all__ = [
    "DEFAULT_ENCODING",
    "ENCODINGS",
    "FORMAT_VERSION",
    "LogitStore",
    "MultiStore",
    "StoreWriter",
    "StoredDocument",
    "get_encoding",
    "kl_bits_per_position",
    "open_stores",
    "store_content_hash",
]
