"""Held-out BPB of an exported student by how the text reaches it.

    python -m benchmarks.loading_paths [MODEL_FOLDER] [HELDOUT_STORE] [--write-card] [--smoke]

Defaults: the quickstart's exported model and held-out store (runs/quickstart); ``--smoke``: the
toy quickstart of ``benchmarks/smoke.py`` in a temporary folder instead (seconds). Rows:

- the teacher's BPB on the store (its stored distributions);
- the student on the store's streams (the teacher's token ends: ``<eot>`` marks or flagged bytes;
  what ``train`` reports);
- the documented loading path: ``AutoTokenizer.from_pretrained(folder, trust_remote_code=True)``
  (the folder's own ``tokenization_bytedistill.py``; a bytes folder's stock tokenizer, no remote
  code) on each document's text, then ``<eos>``;
- plain bytes, ``<bos>`` + the bytes with no token end (an ``<eot>`` folder's stock tokenizer, no
  remote code; a fused folder has none), P(byte) as is;
- the same, renormalised over the 256 unflagged bytes + ``<eos>``
  (a bytes folder has neither: its stream is the plain bytes).

Every row scores the same bytes with the same windows (``bytedistill score`` definitions).
``--write-card`` puts the table into the folder's model card (README.md).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from bytestream.stream_kind import StreamKind
from logit_store import LogitStore
from students.release.exported_folder import folder_stream, load_model
from students.release.score import Document, ScoreOptions, score, score_documents

CARD_HEADING = "## Held-out bits per byte by loading path"


def documented_path_documents(folder: Path, store_path: Path) -> list[Document]:
    """Each held-out document through the folder's tokenizer, as a user loads it: a bytes folder's
    stock one (no remote code), else its remote-code one."""
    from transformers import AutoTokenizer

    plain = folder_stream(folder) is StreamKind.BYTES
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=not plain)
    store = LogitStore(store_path)
    docs = []
    for i in range(len(store)):
        data = store.document(i).layout.text_bytes()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:  # not text: the bytes themselves
            text = None
        if plain:
            symbols = tokenizer(text).input_ids if text is not None else [tokenizer.bos_token_id, *data]
            symbols = [*symbols, tokenizer.eos_token_id]
        elif text is not None:
            symbols = tokenizer(text).input_ids + [tokenizer.stream.eos]
        else:  # the tokenizer's bytes entry point
            symbols = tokenizer.encode_bytes(data, eos=True)
        docs.append(Document(0, np.asarray(symbols, dtype=np.int64), None))
    return docs


def measure(folder: Path, store: Path) -> tuple[list[tuple[str, float]], int]:
    quiet = {"progress": False}
    stream = score(folder, [store], ScoreOptions(mode="stream", **quiet))[-1]
    documented = score_documents(
        load_model(folder), [store], documented_path_documents(folder, store), ScoreOptions(**quiet)
    )[-1]
    if folder_stream(folder) is StreamKind.BYTES:  # its stream is the plain bytes
        assert documented.bytes == stream.bytes, "every row must score the same bytes"
        return [
            ("teacher BPB", stream.teacher_bpb),
            ("bytes stream, the store's text (what `train` reports)", stream.student_bpb),
            ("documented path: `AutoTokenizer.from_pretrained(folder)`, no remote code", documented.student_bpb),
        ], stream.bytes
    plain = score(folder, [store], ScoreOptions(mode="plain", **quiet))[-1]
    renormalised = score(folder, [store], ScoreOptions(mode="plain-renormalised", **quiet))[-1]
    assert documented.bytes == stream.bytes == plain.bytes, "every row must score the same bytes"
    return [
        ("teacher BPB", stream.teacher_bpb),
        ("stream with the teacher's token ends (what `train` reports)", stream.student_bpb),
        ("documented path: `AutoTokenizer(..., trust_remote_code=True)`", documented.student_bpb),
        ("plain bytes (`<bos>` + bytes with no token end), P(byte) as is", plain.student_bpb),
        ("plain bytes, renormalised over the 256 unflagged bytes + `<eos>`", renormalised.student_bpb),
    ], stream.bytes


def table(rows: list[tuple[str, float]], store: Path, n_bytes: int) -> str:
    lines = [
        f"Held-out store `{store.name}`, {n_bytes:,} text bytes.",
        "",
        "| how the text reaches the student | held-out BPB |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value:.4f} |" for name, value in rows]
    return "\n".join(lines)


def write_card(folder: Path, text: str) -> None:
    card = folder / "README.md"
    content = card.read_text(encoding="utf-8")
    content = content.split("\n" + CARD_HEADING)[0].rstrip("\n")
    card.write_text(f"{content}\n\n{CARD_HEADING}\n\n{text}\n", encoding="utf-8")


def report(folder: Path, store: Path, *, card: bool = False) -> str:
    """The table and its summary line; with ``card``, the table also goes into the folder's model card."""
    rows, n_bytes = measure(folder, store)
    text = table(rows, store, n_bytes)
    if card:
        write_card(folder, text)
    stream, documented = rows[1][1], rows[2][1]
    plain = "" if len(rows) < 4 else f"; plain bytes {100 * (rows[3][1] / stream - 1):+.1f}%"
    return f"{text}\n\nsummary: documented path {100 * (documented / stream - 1):+.2f}% vs the stream (goal: within 1%){plain}"


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "model", nargs="?", type=Path, default=Path("runs/quickstart/model"), help="exported model folder"
    )
    parser.add_argument(
        "store", nargs="?", type=Path, default=Path("runs/quickstart/store/heldout"), help="held-out logit store"
    )
    parser.add_argument("--write-card", action="store_true", help="put the table into the folder's model card")
    parser.add_argument("--smoke", action="store_true", help="a toy exported student (seconds): a check that it runs")
    args = parser.parse_args()
    if not args.smoke:
        print(report(args.model, args.store, card=args.write_card))
        return
    from benchmarks.smoke import tiny_exported_student

    with tempfile.TemporaryDirectory() as tmp:
        student = tiny_exported_student(Path(tmp))
        print(report(student.folder, student.heldout_store, card=args.write_card))


if __name__ == "__main__":
    main()
