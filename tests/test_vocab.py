"""Teacher vocabularies: byte-level BPE (real Llama-3), SentencePiece byte fallback, refusals."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers

from bytestream.teacher_tokens import utf8_runs
from bytestream.trie import build_trie
from bytestream.vocab import (
    BYTE_FALLBACK,
    BYTE_LEVEL,
    gpt2_unicode_to_byte,
    load_teacher_tokenizer,
    vocab_from_tokenizer,
)
from common.errors import UserError
from distill.conversion.converter import Converter
from distill.teacher.encode import DocumentEncoder
from tests.conftest import SAMPLE_DOCUMENTS, random_logits
from tests.test_convert import (
    assert_matches_reference,
    reference_context_log_mass,
    reference_distributions,
    teacher_log_likelihood,
)


def test_gpt2_byte_table_is_a_bijection():
    table = gpt2_unicode_to_byte()
    assert sorted(table.values()) == list(range(256))


def test_llama3_vocabulary(llama3_vocab, llama3_tokenizer):
    assert llama3_vocab.family == BYTE_LEVEL
    assert llama3_vocab.size == 128_256
    assert len(llama3_vocab.special_ids) == 256 and min(llama3_vocab.special_ids) == 128_000
    assert llama3_vocab.end_of_text_ids == (128_001, 128_009)
    assert llama3_vocab.prefix_ids == (128_000,)  # <|begin_of_text|>
    # every regular token's bytes are what the tokenizer's own decoder produces for it
    rng = np.random.default_rng(0)
    for i in rng.choice(128_000, 2000, replace=False):
        text = llama3_tokenizer.decode([int(i)])
        if "\ufffd" not in text:
            assert llama3_vocab.token_bytes[i] == text.encode("utf-8")
    assert all(llama3_vocab.single_byte_ids >= 0)


def test_vocab_hash_is_stable_and_sensitive(llama3_vocab, llama3_tokenizer_path):
    again = vocab_from_tokenizer(load_teacher_tokenizer(llama3_tokenizer_path))
    assert again.hash == llama3_vocab.hash
    changed = vocab_from_tokenizer(load_teacher_tokenizer(llama3_tokenizer_path), end_of_text=["<|end_of_text|>"])
    assert changed.hash != llama3_vocab.hash


def test_trie_ranges_match_prefixes(llama3_vocab):
    trie = build_trie(llama3_vocab)
    strings = [llama3_vocab.token_bytes[i] for i in trie.order]
    # every string as a zero-padded row, to test "starts with" against all 128k strings at once
    lengths = np.array([len(s) for s in strings])
    padded = np.zeros((len(strings), lengths.max()), dtype=np.uint8)
    for k, s in enumerate(strings):
        padded[k, : len(s)] = np.frombuffer(s, dtype=np.uint8)
    rng = np.random.default_rng(1)
    for node in rng.choice(trie.num_nodes, 300, replace=False):
        lo, hi, depth = trie.node_lo[node], trie.node_hi[node], trie.node_depth[node]
        prefix = strings[lo][:depth]
        starts = (lengths >= depth) & (padded[:, :depth] == np.frombuffer(prefix, dtype=np.uint8)).all(axis=1)
        assert np.flatnonzero(starts).tolist() == list(range(lo, hi))
        assert trie.node_n_exact[node] == int((starts & (lengths == depth)).sum())
        kids = trie.children(node)
        spans = [lo + trie.node_n_exact[node]] + [x for c in kids for x in (trie.node_lo[c], trie.node_hi[c])] + [hi]
        assert spans[0::2] == spans[1::2]  # the children tile the range after the exact ids
        assert trie.node_of_prefix(prefix) == node


@pytest.mark.parametrize("name", sorted(SAMPLE_DOCUMENTS))
def test_encoding_round_trips_bytes(name, llama3_encoder, llama3_vocab):
    data = SAMPLE_DOCUMENTS[name]
    ids = llama3_encoder.encode(data)
    assert llama3_vocab.bytes_of(ids) == data
    assert not set(ids.tolist()) & set(llama3_vocab.special_ids)


def test_literal_special_text_is_text(llama3_encoder):
    ids = llama3_encoder.encode(b"<|begin_of_text|>")
    assert 128_000 not in ids.tolist() and len(ids) > 1


def test_utf8_runs():
    assert utf8_runs(b"ab\xffc\xc3") == [(True, b"ab"), (False, b"\xff"), (True, b"c"), (False, b"\xc3")]
    assert utf8_runs(b"") == []


def sentencepiece_tokenizer() -> Tokenizer:
    """A small Llama-2-style tokenizer: byte fallback, ▁ for spaces, duplicate byte strings."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["▁", "a", "b", "c", "▁a", "ab", "▁ab", "abc", "▁the", "t", "h", "e", "th", "▁t", "▁th", "A", "é"]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [("▁", "a"), ("a", "b"), ("▁a", "b"), ("ab", "c"), ("t", "h"), ("▁", "t"), ("▁t", "h"), ("▁th", "e")]
    merges = [m for m in merges if "".join(m) in vocab]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    return tok


def test_sentencepiece_byte_fallback_sums_duplicates():
    tok = sentencepiece_tokenizer()
    vocab = vocab_from_tokenizer(tok, end_of_text=["</s>"])
    assert vocab.family == BYTE_FALLBACK and vocab.adds_prefix_space
    assert vocab.token_bytes[3 + 0x41] == vocab.token_bytes[vocab.size - 2] == b"A"
    assert vocab.end_of_text_ids == (2,)
    converter = Converter(vocab)
    encoder = DocumentEncoder(tok, vocab)
    data = "ab abc the Abé xyz😀".encode()
    ids = encoder.encode(data)
    assert vocab.bytes_of(ids) == b" " + data  # the teacher reads the dummy prefix space
    logits = random_logits(len(ids) + 1, vocab.size, seed=2)
    dist = converter.convert_numba(ids, logits)
    assert_matches_reference(dist, reference_distributions(vocab, ids, logits))
    # the identity holds with the masses of ids sharing a byte string added together, given the space
    expected = teacher_log_likelihood(vocab, ids, logits) - reference_context_log_mass(vocab, ids, logits)
    assert dist.log_likelihood() == pytest.approx(expected, rel=1e-9)
    assert dist.layout.text_bytes() == data
    assert any(vocab.token_bytes[t] == b"A" for t in ids)
    # both ids of b"A" feed the one byte
    node = converter.trie.node_of_prefix(b"A")
    assert converter.trie.node_n_exact[node] == 2


def test_unmappable_tokenizer_is_refused():
    spec = json.loads(sentencepiece_tokenizer().to_str())
    spec["model"]["byte_fallback"] = False
    with pytest.raises(UserError, match="cannot be mapped to bytes"):
        vocab_from_tokenizer(Tokenizer.from_str(json.dumps(spec)))


def test_byte_level_token_outside_the_table_is_refused(llama3_tokenizer):
    spec = json.loads(llama3_tokenizer.to_str())
    spec["model"]["vocab"]["☃bad"] = spec["model"]["vocab"].pop("Ġthe")
    spec["model"]["merges"] = []
    with pytest.raises(UserError, match="'☃bad' cannot be mapped to bytes"):
        vocab_from_tokenizer(Tokenizer.from_str(json.dumps(spec)))


def test_missing_tokenizer_file(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_teacher_tokenizer(tmp_path / "nope.json")
