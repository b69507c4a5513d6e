"""Each worker reads its share of the corpus: pieces dealt to the store's writers.

The corpus is cut into pieces, in an order and at places that depend on the corpus alone
(:func:`distill.corpus.spec.corpus_pieces`; what a piece is, per format: :mod:`distill.corpus.formats`).
Piece ``p`` and every document in it belong to writer ``p % writers`` (:mod:`distill.dump.sharding`
deals the writers to the workers), so a worker opens only its writers' pieces, about 1/N of the
corpus with N workers, and a document goes to the same writer, with the same key, whatever the
number of processes, which keeps resuming exact. The held-out decision is by content.
``max_docs`` and ``max_bytes`` count the corpus in order, so with them every worker reads the
corpus up to the limit (and keeps its own documents).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from common.errors import UserError
from distill.corpus.formats import DATASET_PIECE_ROWS, JSONL_PIECE_BYTES, Piece
from distill.corpus.spec import CorpusCounts, CorpusSpec, corpus_pieces, is_saved_dataset, select_documents

READ_BLOCK = 1 << 20


def pieces_settings() -> dict:
    """What places the pieces: recorded in the store, so that a change is refused on resume."""
    return {"jsonl_bytes": JSONL_PIECE_BYTES, "dataset_rows": DATASET_PIECE_ROWS}


def share_fingerprints(
    spec: CorpusSpec, writers: int, mine: list[int], jsonl_piece_bytes: int = JSONL_PIECE_BYTES
) -> dict[int, dict[str, str]]:
    """For each writer in ``mine``, a SHA-256 of the bytes of every file piece dealt to it, by piece
    label: the bytes a resume must find unchanged. Only those pieces are read. A dataset source
    (saved or downloaded) has no file pieces: its identity is its name and settings in the manifest."""
    prints: dict[int, dict[str, str]] = {w: {} for w in mine}
    path = Path(spec.source)
    if not path.exists() or is_saved_dataset(path):
        return prints
    for p, piece in enumerate(corpus_pieces(spec, jsonl_piece_bytes)):
        if p % writers in prints and piece.file is not None:
            prints[p % writers][piece.label] = _piece_digest(piece)
    return prints


def _piece_digest(piece: Piece) -> str:
    digest = hashlib.sha256()
    try:
        with piece.file.open("rb") as f:
            for start, stop in piece.byte_ranges():
                f.seek(start)
                while start < stop and (block := f.read(min(READ_BLOCK, stop - start))):
                    digest.update(block)
                    start += len(block)
    except OSError as exc:
        raise UserError(f"cannot read the corpus file {piece.file}: {exc.strerror or exc}") from None
    return digest.hexdigest()


def writer_documents(
    spec: CorpusSpec,
    writers: int,
    mine: list[int],
    counts: CorpusCounts | None = None,
    jsonl_piece_bytes: int = JSONL_PIECE_BYTES,
    fingerprints: dict[str, str] | None = None,
) -> Iterator[tuple[str, bytes, int]]:
    """The selected documents of writers ``mine`` (of ``writers``), in corpus order:
    ``(key, data, writer)``. Only their pieces are read, unless a document or byte limit is set.
    ``fingerprints`` (by piece label, as :func:`share_fingerprints` gives them when the dump starts):
    a piece that has one is checked against it as it is read (:class:`distill.corpus.formats.ReadCheck`)."""
    counts = counts if counts is not None else CorpusCounts()
    prints = fingerprints or {}
    dealt = [(piece, p % writers) for p, piece in enumerate(corpus_pieces(spec, jsonl_piece_bytes))]
    if spec.max_docs is None and spec.max_bytes is None:
        for piece, writer in dealt:
            if writer in mine:
                tagged = ((key, data, writer) for key, data in piece.documents(prints.get(piece.label)))
                yield from select_documents(spec, counts, tagged)
        return
    everything = (
        (key, data, writer) for piece, writer in dealt for key, data in piece.documents(prints.get(piece.label))
    )
    yield from (item for item in select_documents(spec, counts, everything) if item[2] in mine)
