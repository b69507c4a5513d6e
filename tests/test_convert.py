"""Exactness of the token→byte conversion on the real Llama-3 vocabulary.

docs/DESIGN.md, "Exact conversion" and "Identity".
"""

from __future__ import annotations

import math
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bytestream.alphabet import BOS, EOS, EOT
from distill.conversion.rows import ColumnOrder
from tests.conftest import SAMPLE_DOCUMENTS, random_logits


@dataclass(frozen=True)
class BruteForceTables:
    """A vocabulary's regular (non-special) ids grouped by plain Python byte-string tests, for the
    brute-force references: by their first byte, by every prefix of their byte string (the
    prefix → the (bytes, id) pairs that start with it), and by their whole byte string."""

    kept: np.ndarray  # regular and end-of-text ids, ascending
    by_first_byte: dict[int, np.ndarray]
    by_prefix: dict[bytes, list[tuple[bytes, int]]]
    twins: defaultdict[bytes, list[int]]  # a byte string no regular id has → []


_TABLES: OrderedDict[int, tuple[object, BruteForceTables]] = OrderedDict()


def brute_force_tables(vocab) -> BruteForceTables:
    """The tables of ``vocab``, built once per vocabulary object (the last few kept)."""
    if id(vocab) in _TABLES and _TABLES[id(vocab)][0] is vocab:
        return _TABLES[id(vocab)][1]
    special = set(vocab.special_ids)
    regular = [(vocab.token_bytes[i], i) for i in range(vocab.size) if i not in special]
    first, by_prefix, twins = defaultdict(list), defaultdict(list), defaultdict(list)
    for b, i in regular:
        if b:
            first[b[0]].append(i)
        twins[b].append(i)
        for k in range(1, len(b) + 1):
            by_prefix[b[:k]].append((b, i))
    tables = BruteForceTables(
        kept=np.array(sorted({i for _, i in regular} | set(vocab.end_of_text_ids))),
        by_first_byte={byte: np.array(ids) for byte, ids in first.items()},
        by_prefix=dict(by_prefix),
        twins=twins,
    )
    _TABLES[id(vocab)] = (vocab, tables)
    while len(_TABLES) > 4:
        _TABLES.popitem(last=False)
    return tables


def reference_distributions(vocab, token_ids, logits):
    """Brute force over the whole vocabulary: one {symbol: probability} per stream position.

    Written independently of the trie: prefix tests on Python byte strings (every prefix of
    every token's byte string, as a dictionary), masses summed with math.fsum, ids sharing a
    byte string summed together. With a dummy prefix space (a non-empty document of a teacher
    that adds one) the first row is read given that space.
    """
    context = dummy_prefix(vocab, token_ids)
    end_of_text = set(vocab.end_of_text_ids)
    tables = brute_force_tables(vocab)
    kept = tables.kept
    positions = []
    for j in range(len(token_ids) + 1):
        row = logits[j].astype(np.float64)
        log_z = np.logaddexp.reduce(row[kept])
        q = np.exp(row - log_z)
        if j > 0 or not context:
            groups = {byte: q[ids].tolist() for byte, ids in tables.by_first_byte.items()}
            groups[EOS] = [q[i] for i in end_of_text]
            positions.append({s: math.fsum(v) for s, v in groups.items()})
        if j == len(token_ids):
            break
        token = vocab.token_bytes[token_ids[j]]
        for k in range(len(context) if j == 0 and context else 1, len(token) + 1):
            prefix = token[:k]
            groups = defaultdict(list)
            for b, i in tables.by_prefix.get(prefix, []):
                groups[EOT if len(b) == k else b[k]].append(q[i])
            sums = {s: math.fsum(v) for s, v in groups.items()}
            total = math.fsum(sums.values())
            positions.append({s: m / total for s, m in sums.items()})
    return positions


def dummy_prefix(vocab, token_ids) -> bytes:
    """The space a SentencePiece teacher puts before a non-empty document (context, not text)."""
    return b" " if vocab.adds_prefix_space and len(token_ids) else b""


def reference_context_log_mass(vocab, token_ids, logits) -> float:
    """log of the first row's mass on tokens starting with the dummy prefix space (0 without one)."""
    if not dummy_prefix(vocab, token_ids):
        return 0.0
    keep = np.ones(vocab.size, dtype=bool)
    keep[list(vocab.special_ids)] = False
    starts = np.array([keep[i] and vocab.token_bytes[i][:1] == b" " for i in range(vocab.size)])
    keep[list(vocab.end_of_text_ids)] = True
    row = logits[0].astype(np.float64)
    return float(np.logaddexp.reduce(row[starts]) - np.logaddexp.reduce(row[keep]))


def teacher_log_likelihood(vocab, token_ids, logits) -> float:
    """Σ_j log q_j(bytes(t_j)) + log q_{m+1}(end-of-text), q renormalised over regular +
    end-of-text ids, and the mass of ids sharing a byte string (SentencePiece duplicates) summed."""
    keep = np.ones(vocab.size, dtype=bool)
    keep[list(vocab.special_ids)] = False
    twins = brute_force_tables(vocab).twins
    keep[list(vocab.end_of_text_ids)] = True
    logits = logits.astype(np.float64)
    log_z = np.logaddexp.reduce(np.where(keep, logits, -np.inf), axis=1)
    total = sum(np.logaddexp.reduce(logits[j, twins[vocab.token_bytes[t]]]) - log_z[j] for j, t in enumerate(token_ids))
    return total + np.logaddexp.reduce(logits[-1, list(vocab.end_of_text_ids)]) - log_z[-1]


def assert_matches_reference(dist, reference):
    layout = dist.layout
    assert layout.num_positions == len(reference)
    for i, expected in enumerate(reference):
        support, values = dist.position(i)
        assert support.tolist() == sorted(expected), f"support differs at position {i}"
        want = np.array([expected[s] for s in support.tolist()])
        np.testing.assert_allclose(values, want, rtol=1e-9, atol=1e-300, err_msg=f"position {i}")


REFERENCE_DOCS = ["english", "emoji", "invalid_utf8", "special_literal", "combining", "whitespace"]


@pytest.mark.parametrize("name", REFERENCE_DOCS)
@pytest.mark.parametrize("peaked", [False, True])
def test_numba_path_equals_brute_force(name, peaked, llama3_encoder, llama3_converter, llama3_vocab):
    ids = llama3_encoder.encode(SAMPLE_DOCUMENTS[name])
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=len(name), peaked=peaked)
    dist = llama3_converter.convert_numba(ids, logits)
    assert_matches_reference(dist, reference_distributions(llama3_vocab, ids, logits))


@pytest.mark.parametrize("name", sorted(SAMPLE_DOCUMENTS))
def test_identity_and_normalisation(name, llama3_encoder, llama3_converter, llama3_vocab):
    data = SAMPLE_DOCUMENTS[name]
    ids = llama3_encoder.encode(data)
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=7, peaked=name.startswith("e"))
    dist = llama3_converter.convert_numba(ids, logits)
    assert dist.layout.text_bytes() == data
    sums = np.add.reduceat(dist.values, dist.layout.offsets[:-1])
    np.testing.assert_allclose(sums, 1.0, rtol=0, atol=1e-12)
    expected = teacher_log_likelihood(llama3_vocab, ids, logits)
    assert dist.log_likelihood() == pytest.approx(expected, rel=1e-9)

    as_float32 = llama3_converter.convert_numba(ids, logits.astype(np.float32))
    expected32 = teacher_log_likelihood(llama3_vocab, ids, logits.astype(np.float32))
    assert as_float32.log_likelihood() == pytest.approx(expected32, rel=1e-5)


def test_stream_shape(llama3_encoder, llama3_converter):
    ids = llama3_encoder.encode(b"Hi there")
    layout = llama3_converter.layout(ids)
    symbols = layout.symbols.tolist()
    assert symbols[0] == BOS and symbols[-1] == EOS
    assert symbols.count(EOT) == len(ids)
    assert layout.num_positions == len(symbols) - 1 == len(b"Hi there") + len(ids) + 1
    # supports are ascending and start positions carry <eos>, in-token ones <eot> iff a token
    for i in range(layout.num_positions):
        support = layout.support[layout.offsets[i] : layout.offsets[i + 1]]
        assert np.all(np.diff(support) > 0)
        assert (support[-1] == EOS) == (layout.position_node[i] == 0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_torch_path_agrees_with_numba(dtype, llama3_encoder, llama3_converter, llama3_vocab):
    data = SAMPLE_DOCUMENTS["emoji"] + SAMPLE_DOCUMENTS["invalid_utf8"] + SAMPLE_DOCUMENTS["cjk"]
    ids = llama3_encoder.encode(data)
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=3, peaked=True)
    logits_t = torch.from_numpy(logits).to(dtype)
    on_numba = llama3_converter.convert_numba(ids, logits_t.numpy())
    on_torch = llama3_converter.convert_torch(ids, logits_t)
    np.testing.assert_array_equal(on_torch.layout.support, on_numba.layout.support)
    np.testing.assert_allclose(on_torch.values, on_numba.values, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(on_torch.dropped_mass, on_numba.dropped_mass, rtol=1e-6, atol=1e-15)
    if dtype == torch.float64:
        np.testing.assert_allclose(on_torch.values, on_numba.values, rtol=1e-9, atol=1e-300)


def test_torch_path_small_element_budget(monkeypatch, llama3_encoder, llama3_converter, llama3_vocab):
    """Splitting a document's ranges into many small device batches changes nothing."""
    from distill.conversion import device as convert_torch

    ids = llama3_encoder.encode(SAMPLE_DOCUMENTS["english"])
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=11)
    whole = llama3_converter.convert_torch(ids, torch.from_numpy(logits))
    monkeypatch.setattr(convert_torch, "MAX_ELEMENTS", 1000)
    split = llama3_converter.convert_torch(
        ids,
        torch.from_numpy(logits),
    )
    np.testing.assert_allclose(split.values, whole.values, rtol=1e-12, atol=1e-300)


def test_dropped_special_mass(llama3_encoder, llama3_converter, llama3_vocab):
    ids = llama3_encoder.encode(b"abc")
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=5)
    reserved = llama3_vocab.dropped_ids[5]
    logits[:, reserved] = 60.0  # a special token wins the row: its mass is dropped, not kept
    dist = llama3_converter.convert_numba(ids, logits)
    keep = np.ones(llama3_vocab.size, dtype=bool)
    keep[llama3_vocab.dropped_ids] = False
    total = np.logaddexp.reduce(logits, axis=1)
    dropped = 1 - np.exp(np.logaddexp.reduce(np.where(keep, logits, -np.inf), axis=1) - total)
    np.testing.assert_allclose(dist.dropped_mass, dropped, rtol=1e-9)
    assert dist.log_likelihood() == pytest.approx(teacher_log_likelihood(llama3_vocab, ids, logits), rel=1e-9)


def test_extreme_logits_stay_finite(llama3_encoder, llama3_converter, llama3_vocab):
    """The actual token 900 nats below the row max underflows globally; values stay exact."""
    ids = llama3_encoder.encode(b"zebra")
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=9)
    logits[:, 11] = 1000.0  # id 11 ("," ) dominates every row
    dist = llama3_converter.convert_numba(ids, logits)
    assert np.all(np.isfinite(dist.values))
    sums = np.add.reduceat(dist.values, dist.layout.offsets[:-1])
    np.testing.assert_allclose(sums, 1.0, atol=1e-12)
    on_torch = llama3_converter.convert_torch(ids, torch.from_numpy(logits))
    np.testing.assert_allclose(on_torch.values, dist.values, rtol=1e-9, atol=1e-300)


def test_torch_path_extreme_rows(llama3_encoder, llama3_converter, llama3_vocab):
    """Ranges 1e-30 below the row max, −inf entries, a whole range at −inf, huge and +inf logits:
    never NaN/Inf, every position sums to one, and the finite cases equal a float64 reference."""
    ids = llama3_encoder.encode(b"zebra crossing the antidisestablishmentarian road")
    rows = len(ids) + 1
    logits = random_logits(rows, llama3_vocab.size, seed=21)
    logits[0, 11] = 80.0  # row 0: every other token ~1e-30 below the max and less
    logits[1, ::7] = -np.inf  # −inf entries
    logits[2] = -np.inf  # a whole row at −inf: the uniform distribution, not NaN
    logits[3, 11] = 3e38  # huge
    logits[4, 11] = np.inf
    logits[5, llama3_vocab.dropped_ids[0]] = 1e4  # a special token overwhelms the row
    on_torch = llama3_converter.convert_torch(ids, torch.from_numpy(logits))
    assert np.all(np.isfinite(on_torch.values)) and np.all(np.isfinite(on_torch.dropped_mass))
    sums = np.add.reduceat(on_torch.values, on_torch.layout.offsets[:-1])
    np.testing.assert_allclose(sums, 1.0, atol=1e-12)
    assert on_torch.dropped_mass[5] == 1.0 and on_torch.dropped_mass[2] == 0.0
    numba_rows = llama3_converter.convert_numba(ids, np.tile(logits[:2], ((rows + 1) // 2, 1))[:rows])
    keep = np.repeat(on_torch.layout.position_row < 2, np.diff(on_torch.layout.offsets))
    np.testing.assert_allclose(on_torch.values[keep], numba_rows.values[keep], rtol=1e-9, atol=1e-300)


def test_torch_path_is_deterministic_and_chunkable(llama3_encoder, llama3_converter, llama3_vocab):
    """The same rows convert bit-identically, whole or as row chunks of any split."""
    from distill.conversion.device import torch_conversion

    ids = llama3_encoder.encode(SAMPLE_DOCUMENTS["english"])
    logits = torch.from_numpy(random_logits(len(ids) + 1, llama3_vocab.size, seed=17))
    whole = llama3_converter.convert_torch(ids, logits)
    conversion = torch_conversion(llama3_converter, logits.device)
    pieces = [conversion.convert_rows(whole.layout, logits[a:b], a) for a, b in ((0, 5), (5, 6), (6, len(ids) + 1))]
    np.testing.assert_array_equal(np.concatenate([v for v, _ in pieces]), whole.values)
    np.testing.assert_array_equal(np.concatenate([d for _, d in pieces]), whole.dropped_mass)
    np.testing.assert_array_equal(llama3_converter.convert_torch(ids, logits).values, whole.values)


@settings(max_examples=25, deadline=None)
@given(data=st.binary(min_size=0, max_size=64), seed=st.integers(0, 2**16))
def test_random_bytes_round_trip_and_identity(data, seed, llama3_encoder, llama3_converter, llama3_vocab):
    ids = llama3_encoder.encode(data)
    assert llama3_vocab.bytes_of(ids) == data
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=seed).astype(np.float32)
    dist = llama3_converter.convert_numba(ids, logits)
    assert dist.layout.text_bytes() == data
    np.testing.assert_allclose(np.add.reduceat(dist.values, dist.layout.offsets[:-1]), 1.0, atol=1e-12)
    assert dist.log_likelihood() == pytest.approx(teacher_log_likelihood(llama3_vocab, ids, logits), rel=1e-9)


def test_sorted_columns_equal_teacher_columns(llama3_encoder, llama3_converter, llama3_vocab):
    """Rows from a teacher whose output layer is permuted to byte-string order convert the same."""
    ids = llama3_encoder.encode(SAMPLE_DOCUMENTS["code"])
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=13).astype(np.float32)
    permuted = np.ascontiguousarray(logits[:, llama3_converter.sorted_columns])
    assert sorted(llama3_converter.sorted_columns.tolist()) == list(range(llama3_vocab.size))
    teacher = llama3_converter.convert_numba(ids, logits)
    for dist in (
        llama3_converter.convert_numba(ids, permuted, columns=ColumnOrder.SORTED),
        llama3_converter.convert_torch(ids, torch.from_numpy(permuted), columns=ColumnOrder.SORTED),
    ):
        np.testing.assert_allclose(dist.values, teacher.values, rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(dist.dropped_mass, teacher.dropped_mass, rtol=1e-12, atol=1e-300)


def test_tokens_longer_than_any_fixed_buffer():
    """Tokens of 1,500 and 3,000 bytes (past the kernels' former 1,023-byte path buffers)."""
    from bytestream.vocab import BYTE_LEVEL, TeacherVocab
    from distill.conversion.converter import Converter

    long_tokens = (b"=" * 1500, b"=" * 3000, b"=" * 2999 + b"-")
    vocab = TeacherVocab(
        token_bytes=tuple(bytes([b]) for b in range(256)) + long_tokens + (b"",),
        special_ids=(259,),
        end_of_text_ids=(259,),
        family=BYTE_LEVEL,
    )
    converter = Converter(vocab)
    assert converter.trie.max_depth == 3000
    ids = np.array([256, ord("x"), 257, 258, 256])
    logits = random_logits(len(ids) + 1, vocab.size, seed=4)
    logits[:, 256:259] += 8.0  # the long tokens carry real mass
    dist = converter.convert_numba(ids, logits)
    assert dist.layout.text_bytes() == vocab.bytes_of(ids)
    assert_matches_reference(dist, reference_distributions(vocab, ids, logits))
    assert dist.log_likelihood() == pytest.approx(teacher_log_likelihood(vocab, ids, logits), rel=1e-9)
    on_torch = converter.convert_torch(ids, torch.from_numpy(logits))
    np.testing.assert_allclose(on_torch.values, dist.values, rtol=1e-9, atol=1e-300)


def test_a_sorted_head_is_a_new_teacher_whose_logits_say_their_order(tmp_path, llama3_tokenizer_path, llama3_encoder):
    """``with_sorted_head`` leaves the teacher as it was; each teacher's logits carry their column
    order, and converting them in that order gives the same distributions."""
    from distill.conversion.converter import Converter
    from distill.teacher.model import load_teacher
    from tests.teachers import save_tiny_llama3_teacher

    teacher = load_teacher(str(save_tiny_llama3_teacher(tmp_path / "teacher", llama3_tokenizer_path)))
    converter = Converter(teacher.vocab)
    head = teacher.head
    sorted_teacher = teacher.with_sorted_head(converter.sorted_columns)
    assert teacher.head is head and teacher.columns is ColumnOrder.TEACHER
    assert sorted_teacher.columns is ColumnOrder.SORTED and sorted_teacher.head.weight.dtype == torch.float32

    ids = llama3_encoder.encode(SAMPLE_DOCUMENTS["english"])
    input_ids = torch.tensor([teacher.context_prefix + ids.tolist()])
    rows = [np.arange(len(ids) + 1)]
    mine, permuted = (t.logits(input_ids, torch.ones_like(input_ids), rows) for t in (teacher, sorted_teacher))
    assert (mine.columns, permuted.columns) == (ColumnOrder.TEACHER, ColumnOrder.SORTED)
    np.testing.assert_allclose(permuted.tensor.numpy(), mine.tensor.numpy()[:, converter.sorted_columns], rtol=1e-5)
    expected = converter.convert_numba(ids, mine.tensor.numpy(), mine.columns)
    got = converter.convert_numba(ids, permuted.tensor.numpy(), permuted.columns)
    np.testing.assert_allclose(got.values, expected.values, rtol=1e-5, atol=1e-12)
    with pytest.raises(TypeError):
        converter.convert_numba(ids, permuted.tensor.numpy(), "sorted")
