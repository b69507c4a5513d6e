"""The store's public names in one place (each lives in the module of its concept):
:class:`StoreWriter` (writer.py), :class:`LogitStore` (reader.py), :class:`MultiStore` and
:func:`open_stores` (multi.py), :func:`store_content_hash` (content_hash.py), the manifest
(manifest.py) and the names of its files (file_names.py)."""

from logit_store.content_hash import store_content_hash
from logit_store.file_names import MANIFEST, VOCAB_FILE
from logit_store.integrity import WriterStates, writer_states
from logit_store.manifest import FORMAT_VERSION, manifest_stream, read_manifest
from logit_store.multi import MultiStore, as_store, open_stores
from logit_store.reader import LogitStore, StoredDocument, densify
from logit_store.writer import StoreWriter

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST",
    "VOCAB_FILE",
    "LogitStore",
    "MultiStore",
    "StoreWriter",
    "StoredDocument",
    "WriterStates",
    "as_store",
    "densify",
    "manifest_stream",
    "open_stores",
    "read_manifest",
    "store_content_hash",
    "writer_states",
]
