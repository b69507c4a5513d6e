"""Small real logit stores for the data-loading and trainer tests: real Llama-3 vocabulary,
exact distributions of random logits, many small chunks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bytestream.stream_kind import StreamKind
from logit_store import StoreIdentity, StoreWriter
from tests.conftest import random_logits

WORDS = [
    "in",
    "the",
    "beginning",
    "god",
    "created",
    "heaven",
    "and",
    "earth",
    "light",
    "was",
    "good",
    "day",
    "night",
    "waters",
    "🚀",
    "天地",
    "naïve",
]


def random_texts(count: int, seed: int, min_words: int = 4, max_words: int = 40) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [
        " ".join(rng.choice(WORDS, size=int(rng.integers(min_words, max_words + 1)))).encode() for _ in range(count)
    ]


def write_random_store(directory: Path, vocab, converter, encoder, texts: list[bytes], seed: int = 0, **writer) -> Path:
    """A store of ``texts`` under random teacher logits (small chunks unless ``writer`` says otherwise),
    of the stream ``writer`` names (``<eot>`` if it names none); ``settings``, ``stream`` and
    ``teacher_hash`` among ``writer`` are the store's identity, the rest the writer's own."""
    writer.setdefault("chunk_bytes", 3_000)
    writer.setdefault("docs_per_shard", 16)
    named = {key: writer.pop(key) for key in ("settings", "stream", "teacher_hash") if key in writer}
    identity = StoreIdentity(vocab, encoding="pow8", teacher="random-llama3", **named)
    convert = converter.convert_fused_numba if identity.stream is StreamKind.FUSED else converter.convert_numba
    with StoreWriter(directory, identity, trie=converter.trie, **writer) as out:
        for k, text in enumerate(texts):
            ids = encoder.encode(text)
            logits = random_logits(len(ids) + 1, vocab.size, seed=seed * 100_003 + k, peaked=k % 2 == 1)
            out.add_distributions(convert(ids, logits), key=f"doc-{k}", text_bytes=len(text), token_ids=ids)
    return directory
