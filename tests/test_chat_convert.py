"""Exactness of the conversion of conversations (docs/DESIGN.md, "Conversations"): the template's
specials kept as reserved symbols, against a brute force over the whole vocabulary, and the
identity with the teacher's token log-likelihood less the specials not kept, on both streams and
both conversion paths, for three families with their real chat templates."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from bytestream.alphabet import ALPHABET_SIZE, EOS, EOT, FUSED_ALPHABET_SIZE, FUSED_ENDS, FUSED_EOS
from bytestream.stream_kind import StreamKind
from bytestream.vocab import vocab_from_tokenizer
from distill.corpus.conversations import conversation_document
from tests.chat_families import llama3_family, mistral_family, smollm2_family
from tests.conftest import random_logits
from tests.gguf_teachers import write_tiny_gguf
from tests.teachers import mistral_sentencepiece_folder
from tests.test_convert import brute_force_tables

MULTI_TURN = [
    {"role": "system", "content": "Réponds en une phrase."},
    {"role": "user", "content": "Où est 東京? <|im_end|> [INST]"},
    {"role": "assistant", "content": "Au Japon — 日本."},
    {"role": "user", "content": "Et Zürich?"},
    {"role": "assistant", "content": "En Suisse 🇨🇭"},
]
SINGLE_TURN = [{"role": "user", "content": "Où est 東京? <|eot_id|>"}, {"role": "assistant", "content": " Au Japon."}]


@pytest.fixture(scope="module")
def families(tmp_path_factory, request):
    """name -> (family, the plain vocabulary its brute-force tables come from, its conversation),
    each built when a test first asks for it (Llama-3's tables take many seconds)."""
    root = tmp_path_factory.mktemp("chat-families")
    built: dict = {}

    def get(name: str):
        if name not in built:
            if name == "smollm2":
                fam = smollm2_family(write_tiny_gguf(root / "tiny.gguf", chat_template=True))
                built[name] = (fam, fam.vocab, MULTI_TURN)
            elif name == "mistral":  # its template puts </s> (its end of text) between turns: one turn
                fam = mistral_family(mistral_sentencepiece_folder(root / "v3", "v3"))
                built[name] = (fam, fam.vocab, SINGLE_TURN)
            else:
                vocab = request.getfixturevalue("llama3_vocab")
                trie = request.getfixturevalue("llama3_converter").trie
                fam = llama3_family(request.getfixturevalue("llama3_tokenizer"), vocab, trie)
                built[name] = (fam, vocab, MULTI_TURN)
        return built[name]

    return get


LLAMA3_SLOW = pytest.param("llama3", marks=pytest.mark.slow)  # a brute force over 128k ids per position


def reference(vocab, table_vocab, token_ids, logits, fused: bool):
    """Brute force: one {symbol: probability} per stream position, from byte-string tests over the
    whole vocabulary and math.fsum, with the kept specials' mass as their own root entries."""
    tables = brute_force_tables(table_vocab)
    regular = np.setdiff1d(tables.kept, np.asarray(table_vocab.end_of_text_ids))
    kept = list(vocab.kept_ids)
    norm = np.concatenate([regular, np.asarray(vocab.end_of_text_ids), np.asarray(kept, dtype=np.int64)])
    base, eos = (FUSED_ALPHABET_SIZE, FUSED_EOS) if fused else (ALPHABET_SIZE, EOS)
    positions = []
    for j in range(len(token_ids) + 1):
        row = logits[j].astype(np.float64)
        q = np.exp(row - np.logaddexp.reduce(row[norm]))
        groups = defaultdict(list)
        for byte, ids in tables.by_first_byte.items():
            for i in ids.tolist():
                longer = len(vocab.token_bytes[i]) > 1
                groups[byte if longer or not fused else FUSED_ENDS + byte].append(q[i])
        groups[eos] = [q[i] for i in vocab.end_of_text_ids]
        for r, k in enumerate(kept):
            groups[base + r] = [q[k]]
        sums = {s: math.fsum(v) for s, v in groups.items()}
        total = math.fsum(sums.values())
        positions.append({s: m / total for s, m in sums.items()})
        if j == len(token_ids) or token_ids[j] in kept:
            continue
        token = vocab.token_bytes[token_ids[j]]
        for k in range(1, len(token) if fused else len(token) + 1):
            groups = defaultdict(list)
            for b, i in tables.by_prefix[token[:k]]:
                if fused and len(b) > k:
                    groups[b[k] + (FUSED_ENDS if len(b) == k + 1 else 0)].append(q[i])
                elif not fused:
                    groups[EOT if len(b) == k else b[k]].append(q[i])
            sums = {s: math.fsum(v) for s, v in groups.items()}
            total = math.fsum(sums.values())
            positions.append({s: m / total for s, m in sums.items()})
    return positions


def teacher_log_likelihood(vocab, table_vocab, token_ids, logits) -> float:
    """Σ_j log q_j(t_j) + log q_{m+1}(end of text), q the teacher's softmax over every column less
    the specials not kept (their mass, renormalised away); ids that share a token's bytes summed."""
    twins = brute_force_tables(table_vocab).twins
    logits = logits.astype(np.float64)
    dropped = np.asarray(vocab.dropped_ids)
    log_z = np.logaddexp.reduce(logits, axis=1)
    log_kept = np.log1p(-np.exp(np.logaddexp.reduce(logits[:, dropped], axis=1) - log_z)) + log_z
    total = 0.0
    for j, t in enumerate(token_ids):
        same = [int(t)] if t in vocab.kept_ids else twins[vocab.token_bytes[t]]
        total += np.logaddexp.reduce(logits[j, same]) - log_kept[j]
    return total + np.logaddexp.reduce(logits[-1, list(vocab.end_of_text_ids)]) - log_kept[-1]


def converted(fam, ids, logits, stream: StreamKind, path: str):
    converter = fam.converter
    if path == "torch":
        tensor = torch.from_numpy(logits)
        return (converter.convert_fused_torch if stream is StreamKind.FUSED else converter.convert_torch)(ids, tensor)
    return (converter.convert_fused_numba if stream is StreamKind.FUSED else converter.convert_numba)(ids, logits)


@pytest.mark.parametrize("name", ["smollm2", "mistral", LLAMA3_SLOW])
@pytest.mark.parametrize("stream", StreamKind.stored_kinds(), ids=lambda s: s.value)
def test_chat_conversion_equals_brute_force(families, name, stream):
    fam, table_vocab, messages = families(name)
    ids = fam.chat.encode(conversation_document(messages)).token_ids
    assert set(fam.vocab.kept_ids) & set(ids.tolist())  # the specials are in the document
    logits = random_logits(len(ids) + 1, fam.vocab.size, seed=len(name), peaked=stream is StreamKind.FUSED)
    fused = stream is StreamKind.FUSED
    want = reference(fam.vocab, table_vocab, ids.tolist(), logits, fused)
    for path in ("numba", "torch"):
        dist = converted(fam, ids, logits, stream, path)
        assert dist.layout.num_positions == len(want)
        for i, expected in enumerate(want):
            support, values = dist.position(i)
            assert support.tolist() == sorted(expected), f"{path}: support differs at position {i}"
            got = np.array([expected[s] for s in support.tolist()])
            np.testing.assert_allclose(values, got, rtol=1e-9, atol=1e-300, err_msg=f"{path} position {i}")


@pytest.mark.parametrize("name", ["smollm2", "mistral", LLAMA3_SLOW])
def test_chat_identity_on_both_streams_and_paths(families, name):
    fam, table_vocab, messages = families(name)
    document = fam.chat.encode(conversation_document(messages))
    ids = document.token_ids
    logits = random_logits(len(ids) + 1, fam.vocab.size, seed=7)
    expected = teacher_log_likelihood(fam.vocab, table_vocab, ids.tolist(), logits)
    for stream in StreamKind.stored_kinds():
        for path in ("numba", "torch"):
            dist = converted(fam, ids, logits, stream, path)
            sums = np.add.reduceat(dist.values, dist.layout.offsets[:-1])
            np.testing.assert_allclose(sums, 1.0, rtol=0, atol=1e-12)
            assert dist.log_likelihood() == pytest.approx(expected, rel=1e-9), (stream, path)
            reserved = dist.layout.symbols >= dist.layout.base_alphabet_size
            assert reserved.sum() == np.isin(ids, fam.vocab.kept_ids).sum()  # one symbol per kept special
            assert dist.layout.alphabet_size == dist.layout.base_alphabet_size + len(fam.vocab.kept_ids)


def test_a_kept_end_of_turn_is_not_end_of_text(families):
    """<|im_end|> is among the end-of-text names; kept, it is a symbol of its own and <eos> takes the
    true end of text only (Llama-3's <|eot_id|> likewise: tests/test_chat.py). Mistral's </s> is both
    its end of turn and its only end of text: it stays <eos>."""
    smollm2, mistral = (families(n)[0].vocab for n in ("smollm2", "mistral"))
    assert smollm2.end_of_text_ids == (0,) and smollm2.kept_ids == (1, 2)
    assert mistral.end_of_text_ids == (2,) and 2 not in mistral.kept_ids and {3, 4} <= set(mistral.kept_ids)
    assert not set(smollm2.kept_ids) & set(smollm2.dropped_ids.tolist())


def test_keeping_nothing_changes_nothing(families):
    """A vocabulary that keeps no special hashes as it always did (a plain store's identity is
    unchanged); one that keeps the template's is another vocabulary."""
    fam = families("smollm2")[0]
    plain = vocab_from_tokenizer(fam.tokenizer, name="smollm2")
    assert plain.with_kept([]).hash == plain.hash and plain.with_kept([]) == plain
    assert fam.vocab.hash != plain.hash and plain.with_kept(fam.vocab.kept_ids) == fam.vocab
