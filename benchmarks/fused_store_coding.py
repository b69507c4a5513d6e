"""Where the fused store's extra bytes come from: coding, or information? One run, one table.

The real SmolLM2-135M teacher dumps one corpus (the quickstart's chapters of Genesis) into an
``<eot>`` store and a fused store (docs/DESIGN.md, "The fused stream"). For each: values per text
byte, shard bytes per text byte as stored (``pow8-ans``), and the empirical entropy of its codes
under the store's own context model (support symbol × depth in the token × the code two values
before: what its rANS coder can reach, less the frequency tables the shards also hold). Then the
fused rows under two other codings:

- **paired half**: an "ends" value's context also holds the code of the same byte's "goes on"
  value at its position (16 buckets; coded first in the row), so that the pair's correlation is
  the coder's to use;
- **sums and splits**: each byte's two values as their sum (the ``<eot>`` stream's byte value
  without ``<eot>``, ``pow8``) and, where both exist, the share that ends (8 bits, square-root
  companding), each under symbol × depth.

A line starting ``summary`` gives fused/``<eot>`` as stored against its goal (≤ 1.1) and
the same ratio of entropies under each coding: how far a better coder of these values could go.

    python -m benchmarks.fused_store_coding [--workdir runs/fused-coding] [--chapters 12] [--markdown]
    python -m benchmarks.fused_store_coding --smoke   # the tiny teacher, two chapters: seconds
"""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.results import markdown_table, write_section
from bytestream.alphabet import FUSED_ENDS, NUM_BYTES
from bytestream.stream import target_indices
from logit_store import rans
from logit_store.encodings import ContextCodedEncoding

GOAL_STORE = 1.1
PAIR_BUCKETS = 16  # the paired "goes on" code, in steps of 16
CODING = ContextCodedEncoding()


@dataclass
class Coded:
    """One store's values, flattened over its documents."""

    text_bytes: int
    shard_bytes: int
    codes: np.ndarray  # (S,) the stored pow8 codes
    contexts: np.ndarray  # (S,) the store's own rANS context of each value
    values: np.ndarray  # (S,) decoded probabilities
    symbols: np.ndarray  # (S,) support symbol
    positions: np.ndarray  # (S,) the value's position, numbered over the store
    depths: np.ndarray  # (S,) its position's depth in the token, capped at 2


def conditional_entropy(contexts: np.ndarray, codes: np.ndarray) -> float:
    """Empirical H(code | context) of the whole sample, in bytes."""
    _, joint = np.unique(contexts.astype(np.int64) * 4096 + codes, return_counts=True)
    _, marginal = np.unique(contexts, return_counts=True)
    return float((marginal * np.log2(marginal)).sum() - (joint * np.log2(joint)).sum()) / 8


def read(path: Path) -> Coded:
    """Each value's code, its context as the store's coder chains it (``rans.chained_contexts``),
    its decoded probability, symbol, position and depth; each chunk decoded once."""
    from logit_store import LogitStore

    store = LogitStore(path)
    if store.encoding.name != CODING.name:
        raise SystemExit(f"{path} is coded with {store.encoding.name}; this benchmark reads {CODING.name} stores")
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("codes", "ctx", "values", "symbols", "pos", "depth")}
    first_position = 0
    for i in range(len(store)):
        encoded = store.encoded_document(i)
        layout = encoded.layout  # made while decoding the chunk's entropy-coded values
        codes = encoded.value_bytes.reshape(-1)
        groups = CODING.contexts(layout)  # 2 × (symbol + alphabet × depth) + first value of its position
        contexts, _ = rans.chained_contexts(groups, 5, CODING.PREVIOUS, codes, CODING.num_contexts)
        parts["codes"].append(codes.astype(np.int64))
        parts["ctx"].append(contexts.astype(np.int64))
        targets = target_indices(layout)
        parts["values"].append(
            store.encoding.decode(encoded.value_bytes, encoded.position_bytes, layout.offsets, targets)
        )
        parts["symbols"].append(layout.support.astype(np.int64))
        parts["pos"].append(np.repeat(np.arange(layout.num_positions), np.diff(layout.offsets)) + first_position)
        parts["depth"].append((groups.astype(np.int64) >> 1) // layout.alphabet_size)
        first_position += layout.num_positions
    joined = {k: np.concatenate(v) if v else np.zeros(0, np.int64) for k, v in parts.items()}
    stats = store.stats()
    return Coded(
        stats["text_bytes"],
        stats["shard_bytes"],
        joined["codes"],
        joined["ctx"],
        joined["values"].astype(np.float64),
        joined["symbols"],
        joined["pos"],
        joined["depth"],
    )


def paired_half(fused: Coded) -> float:
    """Entropy (bytes) with each 'ends' value's context also holding its byte's 'goes on' code."""
    ends = (fused.symbols >= FUSED_ENDS) & (fused.symbols < FUSED_ENDS + NUM_BYTES)
    goes = fused.symbols < NUM_BYTES
    goes_keys = fused.positions[goes] * NUM_BYTES + fused.symbols[goes]  # sorted: positions, then bytes
    order = np.argsort(goes_keys, kind="stable")
    goes_keys, goes_codes = goes_keys[order], fused.codes[goes][order]
    wanted = fused.positions[ends] * NUM_BYTES + (fused.symbols[ends] - FUSED_ENDS)
    pair = np.zeros(len(fused.codes), np.int64)
    if len(goes_keys):
        at = np.minimum(np.searchsorted(goes_keys, wanted), len(goes_keys) - 1)
        found = goes_keys[at] == wanted
        pair[np.flatnonzero(ends)] = np.where(found, 1 + goes_codes[at] // (256 // PAIR_BUCKETS), 0)
    return conditional_entropy(fused.contexts * (PAIR_BUCKETS + 1) + pair, fused.codes)


def byte_halves(fused: Coded):
    """Over the (position, byte) pairs a fused store supports: which values are text bytes' (not
    ``<eos>``), each such value's pair, the pairs, and how many of the two halves each has."""
    text = fused.symbols < FUSED_ENDS + NUM_BYTES
    byte = np.where(fused.symbols >= FUSED_ENDS, fused.symbols - FUSED_ENDS, fused.symbols)[text]
    unique, inverse, halves = np.unique(
        fused.positions[text] * NUM_BYTES + byte, return_inverse=True, return_counts=True
    )
    return text, inverse, unique, halves


def sums_and_splits(fused: Coded) -> float:
    """Entropy (bytes) of each byte's summed value (pow8) and, where both halves exist, its split."""
    text, inverse, unique, halves = byte_halves(fused)
    ends = (fused.symbols >= FUSED_ENDS)[text]
    total = np.bincount(inverse, weights=fused.values[text], minlength=len(unique))
    ended = np.bincount(inverse, weights=np.where(ends, fused.values[text], 0.0), minlength=len(unique))
    depth = np.zeros(len(unique), np.int64)
    depth[inverse] = fused.depths[text]
    context = unique % NUM_BYTES + NUM_BYTES * depth
    gamma = CODING.gamma
    sums = np.clip(np.round(total**gamma * 255), 0, 255).astype(np.int64)
    both = halves == 2
    splits = np.clip(np.round(np.sqrt(ended[both] / total[both]) * 255), 0, 255).astype(np.int64)
    return conditional_entropy(context, sums) + conditional_entropy(context[both], splits)


def stores(work: Path, chapters: int, smoke: bool) -> dict[str, Path]:
    from benchmarks.patched import dump_store

    if smoke:
        from benchmarks.smoke import tiny_teacher

        teacher = str(tiny_teacher())
    else:
        from benchmarks.common import smollm2_gguf

        teacher = str(smollm2_gguf())
    return {s: dump_store(work, f"train-{s}", ["Genesis"], chapters, teacher, stream=s) for s in ("eot", "fused")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("runs/fused-coding"), help="the two stores go here")
    parser.add_argument("--chapters", type=int, default=12, help="chapters of Genesis (the quickstart's 12)")
    parser.add_argument("--markdown", action="store_true", help="a markdown table, also written into docs/RESULTS.md")
    parser.add_argument("--smoke", action="store_true", help="the tiny teacher, two chapters: seconds")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch) if args.smoke else args.workdir
        paths = stores(work, 2 if args.smoke else args.chapters, args.smoke)
        eot, fused = read(paths["eot"]), read(paths["fused"])
    text = eot.text_bytes
    rows = [
        ("<eot>", "as stored", eot, conditional_entropy(eot.contexts, eot.codes)),
        ("fused", "as stored", fused, conditional_entropy(fused.contexts, fused.codes)),
        ("fused", "paired half as context", fused, paired_half(fused)),
        ("fused", "sums and splits", fused, sums_and_splits(fused)),
    ]
    header = ["stream", "coding", "values / text byte", "shard B / text byte", "entropy B / text byte"]
    body = [
        [
            s,
            c,
            f"{len(d.codes) / text:.1f}",
            f"{d.shard_bytes / text:.2f}" if c == "as stored" else "",
            f"{h / text:.2f}",
        ]
        for s, c, d, h in rows
    ]
    table = markdown_table(header, body)
    base = rows[0][3]
    both = float(np.mean(byte_halves(fused)[3] == 2))
    stored = fused.shard_bytes / eot.shard_bytes
    line = (
        f"summary: fused/<eot> shard bytes {stored:.2f} ({'met' if stored <= GOAL_STORE else 'MISSED'}, goal <= "
        f"{GOAL_STORE}); entropy ratio under the store's contexts {rows[1][3] / base:.2f}, with the paired half "
        f"{rows[2][3] / base:.2f}, as sums and splits {rows[3][3] / base:.2f}; both halves at {100 * both:.0f}% of "
        f"the supported bytes ({text:,} text bytes; entropies leave out the frequency tables the shards hold)"
    )
    print(table)
    print(line)
    if args.markdown and not args.smoke:
        write_section("fused_store_coding", f"{table}\n\n`{line}`")


if __name__ == "__main__":
    main()
