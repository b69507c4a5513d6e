"""Several stores with one vocabulary read as one (:class:`MultiStore`, :func:`open_stores`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bytestream.trie import VocabTrie
from bytestream.vocab import TeacherVocab
from common.errors import UserError
from logit_store.chunk import EncodedDocument
from logit_store.manifest import read_manifest
from logit_store.reader import LogitStore, StoreBase, StoredDocument
from logit_store.teachers import refuse_other_teachers


class MultiStore(StoreBase):
    """Several stores with the same vocabulary and stream, read as one (documents in the given order)."""

    def __init__(self, stores: list[LogitStore]):
        if not stores:
            raise UserError("no logit stores given")
        first = stores[0]
        for other in stores[1:]:
            if other.vocab_hash != first.vocab_hash:
                raise UserError(
                    f"stores {first.directory} and {other.directory} have different vocabularies "
                    f"({first.vocab_hash[:12]}… vs {other.vocab_hash[:12]}…); they cannot be read together"
                )
            if other.stream is not first.stream:
                raise UserError(
                    f"stores {first.directory} and {other.directory} hold different streams "
                    f"({first.stream.shown} vs {other.stream.shown}); they cannot be read together"
                )
        refuse_other_teachers([(s.directory, s.manifest) for s in stores])
        self.stores = list(stores)
        self.vocab_hash = first.vocab_hash
        self.stream = first.stream
        counts = [s.num_documents for s in self.stores]
        self._start = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_documents = int(self._start[-1])

    @property
    def vocab(self) -> TeacherVocab:
        return self.stores[0].vocab

    @property
    def trie(self) -> VocabTrie:
        return self.stores[0].trie

    def _locate(self, i: int) -> tuple[LogitStore, int]:
        if not 0 <= i < self.num_documents:
            raise IndexError(f"document {i} out of range ({self.num_documents} documents)")
        k = int(np.searchsorted(self._start, i, side="right") - 1)
        return self.stores[k], i - int(self._start[k])

    def document(self, i: int) -> StoredDocument:
        store, j = self._locate(i)
        return store.document(j)

    def document_tokens(self, i: int) -> np.ndarray:
        store, j = self._locate(i)
        return store.document_tokens(j)

    def encoded_document(self, i: int) -> EncodedDocument:
        store, j = self._locate(i)
        return store.encoded_document(j)

    def document_roles(self, i: int) -> np.ndarray | None:
        store, j = self._locate(i)
        return store.document_roles(j)

    @property
    def reserved_symbols(self) -> list[dict]:
        return self.stores[0].reserved_symbols

    def chunk_spans(self) -> list[tuple[int, int]]:
        """(first document, number of documents) of every chunk of every store, in document order."""
        return [
            (start + first, n) for start, s in zip(self._start.tolist(), self.stores) for first, n in s.chunk_spans()
        ]

    def document_positions(self) -> np.ndarray:
        return np.concatenate([s.document_positions() for s in self.stores])

    def stats(self) -> dict:
        each = [s.stats() for s in self.stores]
        summed = (
            "documents",
            "text_bytes",
            "positions",
            "tokens",
            "values",
            "shards",
            "chunks",
            "size_on_disk",
            "shard_bytes",
        )
        out = {k: sum(e[k] for e in each) for k in summed}
        out["bytes_per_text_byte"] = out["size_on_disk"] / out["text_bytes"] if out["text_bytes"] else None
        out["shard_bytes_per_text_byte"] = out["shard_bytes"] / out["text_bytes"] if out["text_bytes"] else None
        out["encoding"] = sorted({e["encoding"] for e in each})
        out["teacher"] = sorted({e["teacher"] for e in each})
        out["vocab_hash"] = self.vocab_hash
        out["stream"] = self.stream.value
        return out


def open_stores(paths, expected_vocab_hash: str | None = None) -> MultiStore:
    """Open one or more store directories as one :class:`MultiStore`."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    return MultiStore(_open_sharing_trie(paths, expected_vocab_hash))


def _open_sharing_trie(paths, expected_vocab_hash: str | None = None) -> list[LogitStore]:
    """The stores at ``paths``; those with the first one's vocabulary share its trie (the others are
    refused by :class:`MultiStore`, naming both)."""
    first = LogitStore(paths[0], expected_vocab_hash=expected_vocab_hash)
    rest = [
        LogitStore(p, expected_vocab_hash, trie=first.trie if _vocab_hash(p) == first.vocab_hash else None)
        for p in paths[1:]
    ]
    return [first, *rest]


def _vocab_hash(path) -> str:
    return read_manifest(Path(path))["vocab_hash"]


def as_store(stores) -> LogitStore | MultiStore:
    """A store, a path, or a list of stores/paths → something with the reader API."""
    if isinstance(stores, (LogitStore, MultiStore)):
        return stores
    if isinstance(stores, (str, Path)):
        return LogitStore(stores)
    if all(isinstance(s, (str, Path)) for s in stores):
        opened = _open_sharing_trie(list(stores))
    else:
        opened = [s if isinstance(s, LogitStore) else LogitStore(s) for s in stores]
    return opened[0] if len(opened) == 1 else MultiStore(opened)
