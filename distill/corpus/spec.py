"""A corpus: which documents to read (:class:`CorpusSpec`), its pieces in a deterministic order,
and the selection on top of them.

Sources (by what ``--corpus`` names):

* a ``.txt`` file or a folder of them: one document per file, or, with ``separator``, the
  file split on that exact string (e.g. ``"\\n\\n\\n"``);
* ``.jsonl`` / ``.jsonl.zst`` / ``.parquet`` files (or folders of them): one document per record,
  the text in ``text_field``;
* a folder written by ``datasets``' ``save_to_disk`` is opened with ``load_from_disk``;
* anything else is handed to ``datasets.load_dataset`` as a dataset name, with ``split``,
  ``config`` and ``streaming``.

Each format has one reader, which lists a file's pieces and reads a piece's documents with their
keys (:mod:`distill.corpus.formats`); the source is its files' pieces in sorted order, and reading
it whole is reading every piece in turn (:func:`raw_documents`), as a dump's workers read their
shares of it (:mod:`distill.corpus.shares`). Selection is applied on top: a deterministic held-out
split by a hash of each document's content, ``max_docs`` and ``max_bytes``. Empty documents are
skipped and counted; corpus entries that are not read are counted by reason
(:mod:`distill.corpus.files`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from common.errors import UserError
from configs.ranges import COUNT, FRACTION
from distill.corpus.files import RECORD_SUFFIXES, TEXT_SUFFIXES, CorpusListing, file_suffix, list_corpus
from distill.corpus.formats import JSONL_PIECE_BYTES, DatasetRows, Piece, file_formats


@dataclass
class CorpusSpec:
    """Which documents to read: a source and a selection on top of it. As ``dump`` flags and config
    keys: ``source`` is ``corpus``, ``split`` is ``dataset_split``, ``config`` is ``dataset_config``;
    a store's manifest records the fields by their names here."""

    source: str = field(
        metadata={
            "flag": "corpus",
            "help": ".txt/.jsonl/.jsonl.zst/.parquet file or folder, a save_to_disk folder, or a dataset name",
        }
    )
    text_field: str = field(
        default="text", metadata={"help": "record field holding the text (jsonl, parquet, datasets)"}
    )
    separator: str | None = field(
        default=None,
        metadata={"help": "split .txt files into documents on this exact string (default: one document per file)"},
    )
    split: str = field(default="train", metadata={"flag": "dataset_split", "help": "split of a datasets source"})
    config: str | None = field(
        default=None, metadata={"flag": "dataset_config", "help": "configuration name of a datasets source"}
    )
    streaming: bool = field(default=False, metadata={"help": "stream a datasets source instead of downloading it"})
    subset: str = field(
        default="all",
        metadata={
            "help": "which side of the deterministic held-out split to distil",
            "choices": ["all", "train", "heldout"],
        },
    )
    heldout_fraction: float = field(
        default=0.0,
        metadata={"help": "fraction of documents (by a hash of their key) in the held-out side", "range": FRACTION},
    )
    max_docs: int | None = field(
        default=None,
        metadata={"help": "stop after this many documents (before the split across workers)", "range": COUNT},
    )
    max_bytes: int | None = field(default=None, metadata={"help": "stop after this many bytes of text", "range": COUNT})


@dataclass
class CorpusCounts:
    documents: int = 0
    bytes: int = 0
    empty_skipped: int = 0


def corpus_files(source: Path) -> list[Path]:
    """The files of a file-based source in sorted order (a folder is searched recursively)."""
    listing = list_corpus(source)
    if not listing.files:
        note = listing.not_read_note()
        raise UserError(
            f"no .txt/.jsonl/.jsonl.zst/.parquet files under {source}" + (f"; not read: {note}" if note else "")
        )
    files = listing.files
    return files


def load_dataset(spec: CorpusSpec, from_disk: bool = False):
    import datasets

    try:
        if from_disk:
            dataset = datasets.load_from_disk(spec.source)
            if isinstance(dataset, datasets.DatasetDict):
                dataset = dataset[spec.split]
        else:
            dataset = datasets.load_dataset(spec.source, spec.config, split=spec.split, streaming=spec.streaming)
    except Exception as exc:  # noqa: BLE001 - datasets raises many types for a bad source
        raise UserError(
            f"cannot load dataset {spec.source!r} (split {spec.split!r}): {str(exc).splitlines()[0]}"
        ) from None
    return dataset


def check_source(spec: CorpusSpec) -> None:
    """Fail fast on a corpus path that does not exist (a dataset name is checked when loaded)."""
    path = Path(spec.source)
    looks_like_path = spec.source.startswith((".", "/", "~")) or file_suffix(path) in TEXT_SUFFIXES + RECORD_SUFFIXES
    if not path.exists() and looks_like_path:
        raise UserError(f"corpus not found: {spec.source}")
    if spec.separator == "":
        raise UserError("--separator must not be empty (leave it out for one document per file)")
    if path.is_dir() and not is_saved_dataset(path):
        corpus_files(path)  # raises when the folder holds no corpus files


def corpus_listing(spec: CorpusSpec) -> CorpusListing | None:
    """A local corpus's files and the entries that are not read, with why (None for a dataset)."""
    path = Path(spec.source)
    if not path.exists() or is_saved_dataset(path):
        return None
    return list_corpus(path)


def is_saved_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists())


def corpus_pieces(spec: CorpusSpec, jsonl_piece_bytes: int = JSONL_PIECE_BYTES) -> list[Piece]:
    """The source's pieces in corpus order, each read by its format (:mod:`distill.corpus.formats`);
    a dataset is loaded here, once."""
    check_source(spec)
    path = Path(spec.source)
    if not path.exists() or is_saved_dataset(path):
        name = path.name if path.exists() else spec.source  # a key never holds a local path
        dataset = load_dataset(spec, from_disk=path.exists())
        return DatasetRows(dataset, name, spec.source, spec.split, spec.text_field).pieces()
    formats = file_formats(spec.separator, spec.text_field, jsonl_piece_bytes)
    return [
        piece for file in corpus_files(path) for piece in formats[file_suffix(file)].pieces(file, file_key(file, path))
    ]


def raw_documents(spec: CorpusSpec) -> Iterator[tuple[str, bytes]]:
    """Every document of the source, before selection: all its pieces in order."""
    for piece in corpus_pieces(spec):
        yield from piece.documents()


def file_key(file: Path, source: Path) -> str:
    """A corpus file's name in document keys: relative to the corpus folder, never absolute."""
    return file.relative_to(source).as_posix() if source.is_dir() else file.name


def in_heldout(data: bytes, fraction: float) -> bool:
    """Deterministic by content: the same document always lands on the same side, however its
    corpus is named, moved or split into files."""
    digest = hashlib.sha256(data).digest()
    return int.from_bytes(digest[:8], "little") / 2**64 < fraction


def select_documents(
    spec: CorpusSpec, counts: CorpusCounts | None = None, documents: Iterable[tuple] | None = None
) -> Iterator[tuple]:
    """The documents to distil, in order, with the spec's selection applied: ``(key, data)``, or
    whatever tuples ``documents`` gives that start with them (default: the whole source's)."""
    counts = counts if counts is not None else CorpusCounts()
    if spec.subset not in ("all", "train", "heldout"):
        raise UserError(f"subset must be all, train or heldout, not {spec.subset!r}")
    if spec.subset != "all" and not 0 < spec.heldout_fraction < 1:
        raise UserError("--subset train/heldout needs --heldout-fraction between 0 and 1")
    for item in raw_documents(spec) if documents is None else documents:
        data = item[1]
        if spec.max_docs is not None and counts.documents >= spec.max_docs:
            return
        if spec.max_bytes is not None and counts.bytes >= spec.max_bytes:
            return
        if spec.subset != "all" and in_heldout(data, spec.heldout_fraction) != (spec.subset == "heldout"):
            continue
        if not data:
            counts.empty_skipped += 1
            continue
        counts.documents += 1
        counts.bytes += len(data)
        yield item


def corpus_fingerprint(spec: CorpusSpec) -> str:
    """Identity of the corpus for the store manifest, from its listing alone (no file is read): the
    selection settings plus, for local file sources, each file's name relative to the corpus and
    its size. Where local files lie is not part of it, so a moved corpus, or one named by a
    relative path, still resumes. The bytes themselves are fingerprinted piece by piece by the
    writers they are dealt to (:func:`distill.corpus.shares.share_fingerprints`), so no worker
    reads more than its share."""
    settings = dict(spec.__dict__)
    path = Path(spec.source)
    local_files = path.exists() and not is_saved_dataset(path)
    if local_files:
        del settings["source"]
    elif path.exists():
        settings["source"] = str(path.resolve())
    h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    if local_files:
        for file in corpus_files(path):
            h.update(f"{file_key(file, path)}|{file.stat().st_size}|".encode())
    return h.hexdigest()
