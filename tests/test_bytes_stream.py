"""The bytes stream (docs/DESIGN.md, "The bytes stream"): its targets, the fused rows with each byte's
two halves summed, equal a brute force from the teacher's token distribution on the real Llama-3
vocabulary and on real SentencePiece models; the store reader's summed rows are the sums of the
stored halves; a flat student trains and evaluates on it from the command line, and the streams or
architectures it cannot take are refused in one line."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bytedistill.cli import main as cli_main
from bytestream.alphabet import (
    ALPHABET_SIZE,
    BYTES_ALPHABET_SIZE,
    BYTES_BOS,
    BYTES_EOS,
    FUSED_BOS,
    FUSED_ENDS,
    NUM_BYTES,
)
from bytestream.bytes_stream import bytes_rows, bytes_symbols
from bytestream.stream_kind import StreamKind
from bytestream.stream_symbols import stream_symbols
from logit_store.reader import densify
from students.training.checkpoints import latest_checkpoint
from students.training.store_windows import PackedStreamDataset
from tests.conftest import SAMPLE_DOCUMENTS, random_logits
from tests.stores import random_texts, write_random_store
from tests.test_convert import brute_force_tables, dummy_prefix
from tests.test_sentencepiece import DOCUMENTS as SP_DOCUMENTS
from tests.test_sentencepiece import families, folders  # noqa: F401  (module-scoped fixtures, used by name)


def reference_bytes(vocab, token_ids, logits) -> np.ndarray:
    """Brute force: one row over the bytes alphabet per position, P(b | s) = M(s·b) / C(s), from the
    teacher's token distribution q alone (prefix tests on Python byte strings, math.fsum). M(x) is the
    mass of the tokens whose bytes start with x, C(s) the mass that goes on past s (at a token boundary,
    every regular and end-of-text id; ``<eos>`` takes the end-of-text mass)."""
    context = dummy_prefix(vocab, token_ids)
    tables = brute_force_tables(vocab)
    end_of_text = list(vocab.end_of_text_ids)
    rows = []

    def mass(q, prefix: bytes, longer_than: int = -1) -> float:  # M(prefix), or only the tokens longer than that
        return math.fsum(q[i] for b, i in tables.by_prefix.get(prefix, []) if len(b) > longer_than)

    for j in range(len(token_ids) + 1):
        logit = logits[j].astype(np.float64)
        q = np.exp(logit - np.logaddexp.reduce(logit[tables.kept]))
        if j > 0 or not context:  # a token boundary: the previous token ended (or the document starts)
            total = math.fsum(q[tables.kept].tolist())
            row = np.zeros(BYTES_ALPHABET_SIZE)
            for b in range(NUM_BYTES):
                row[b] = mass(q, bytes([b])) / total
            row[BYTES_EOS] = math.fsum(q[end_of_text].tolist()) / total
            rows.append(row)
        if j == len(token_ids):
            break
        token = vocab.token_bytes[token_ids[j]]
        for k in range(
            len(context) if j == 0 and context else 1, len(token)
        ):  # inside the token, s = its first k bytes
            prefix = token[:k]
            going_on = mass(q, prefix, longer_than=k)  # C(s) = M(s) − q(s)
            row = np.zeros(BYTES_ALPHABET_SIZE)
            for b in range(NUM_BYTES):
                row[b] = mass(q, prefix + bytes([b])) / going_on
            rows.append(row)
    return np.array(rows)


def summed_conversion(converter, ids, logits) -> np.ndarray:
    """The conversion's float64 fused rows, dense, with each byte's halves summed."""
    dist = converter.convert_fused_numba(ids, logits)
    dense = densify(dist.layout, dist.values, np.zeros((dist.layout.num_positions, dist.layout.alphabet_size)))
    return bytes_rows(dense)


@pytest.mark.parametrize("name", ["english", "emoji", "invalid_utf8", "special_literal", "whitespace", "long_tokens"])
def test_summed_rows_equal_brute_force_on_llama3(name, llama3_encoder, llama3_converter, llama3_vocab):
    data = SAMPLE_DOCUMENTS[name]
    ids = llama3_encoder.encode(data)
    logits = random_logits(len(ids) + 1, llama3_vocab.size, seed=len(name) + 3, peaked=len(name) % 2 == 0)
    got = summed_conversion(llama3_converter, ids, logits)
    want = reference_bytes(llama3_vocab, ids, logits)
    assert got.shape == want.shape == (len(data) + 1, BYTES_ALPHABET_SIZE)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-300)
    np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=0, atol=1e-12)


@pytest.mark.parametrize("family", ["mistral-v1-auto", "phi3"])
@pytest.mark.parametrize("name", ["sentencepiece_specials", "leading_space", "one_space", "invalid_first", "emoji"])
def test_summed_rows_equal_brute_force_on_sentencepiece(family, name, families):  # noqa: F811
    _, vocab, encoder, converter = families[family]
    data = SP_DOCUMENTS[name]
    ids = encoder.encode(data)
    logits = random_logits(len(ids) + 1, vocab.size, seed=len(name) + 5, peaked=name == "emoji")
    got = summed_conversion(converter, ids, logits)
    want = reference_bytes(vocab, ids, logits)
    assert got.shape == want.shape == (len(data) + 1, BYTES_ALPHABET_SIZE)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-300)


def test_bytes_symbols_drop_the_flag_and_move_the_specials_down():
    fused = np.array([FUSED_BOS, ord("a"), FUSED_ENDS + ord("b"), FUSED_BOS + 1, FUSED_BOS + 3, FUSED_BOS + 4])
    assert bytes_symbols(fused).tolist() == [256, ord("a"), ord("b"), 257, 259, 260]


def test_the_tokens_as_each_streams_symbols_are_the_fused_ones_turned_as_the_reader_turns_them():
    spelled = [b"In", b" the", 1, b"", b" begi"]  # a reserved special (id 1) and a token with no bytes
    fused = stream_symbols(spelled, StreamKind.FUSED, eos=True)
    plain = stream_symbols(spelled, StreamKind.BYTES, eos=True)
    assert plain == bytes_symbols(np.array(fused)).tolist()
    assert plain == [BYTES_BOS, *b"In the", BYTES_ALPHABET_SIZE + 1, *b" begi", BYTES_EOS]
    eot = stream_symbols(spelled, StreamKind.EOT)
    assert [s for s in eot if s != StreamKind.EOT.eot] == [StreamKind.EOT.bos, *b"In the", ALPHABET_SIZE + 1, *b" begi"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory, llama3_vocab, llama3_converter, llama3_encoder) -> dict[str, str]:
    """A training and a held-out fused store, and an <eot> store, of random texts."""
    root = tmp_path_factory.mktemp("bytes-stores")
    helpers = (llama3_vocab, llama3_converter, llama3_encoder)
    return {
        "fused": str(write_random_store(root / "fused", *helpers, random_texts(10, seed=1), stream=StreamKind.FUSED)),
        "fused-eval": str(
            write_random_store(root / "eval", *helpers, random_texts(4, seed=2), seed=9, stream=StreamKind.FUSED)
        ),
        "eot": str(write_random_store(root / "eot", *helpers, random_texts(4, seed=1))),
    }


def test_the_readers_summed_rows_are_the_sums_of_the_stored_halves(stores):
    """Window by window, the bytes dataset of a fused store holds its fused windows with the flag dropped
    and each byte's stored "goes on" and "ends" probabilities added (one float32 addition), the specials'
    columns as stored."""
    settings = {"seq_len": 48, "batch_size": 3, "shuffle": False, "teacher_dtype": "float32"}
    fused = PackedStreamDataset([stores["fused"]], **settings)
    summed = PackedStreamDataset([stores["fused"]], stream=StreamKind.BYTES, **settings)
    assert summed.stream is StreamKind.BYTES and summed.alphabet_size == BYTES_ALPHABET_SIZE
    pairs = list(zip(fused.loader(), summed.loader(), strict=True))
    assert pairs
    for f, b in pairs:
        halves = f["target_probs"][..., :NUM_BYTES].numpy() + f["target_probs"][..., FUSED_ENDS:FUSED_BOS].numpy()
        np.testing.assert_array_equal(b["target_probs"][..., :NUM_BYTES].numpy(), halves)
        np.testing.assert_array_equal(b["target_probs"][..., NUM_BYTES:], f["target_probs"][..., FUSED_BOS:])
        for key in ("input_ids", "target_ids"):
            want = np.where(f[key] < FUSED_BOS, f[key] % NUM_BYTES, f[key] - FUSED_BOS + NUM_BYTES)
            np.testing.assert_array_equal(b[key].numpy(), want)
        np.testing.assert_array_equal(b["loss_mask"], f["loss_mask"])


TRAIN = ["--seq-len", "32", "--batch-size", "2", "--max-steps", "3", "--warmup-steps", "2", "--preset", "micro"]


def test_train_stream_bytes_trains_and_evaluates_a_flat_student(tmp_path, stores, capsys):
    import json

    out = tmp_path / "run"
    args = ["train", "--train-stores", stores["fused"], "--eval-store", stores["fused-eval"], "--stream", "bytes"]
    assert cli_main([*args, *TRAIN, "--output-dir", str(out)]) == 0
    checkpoint = latest_checkpoint(out)
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["vocab_size"] == BYTES_ALPHABET_SIZE and config["byte_stream"] == "bytes"
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (256, 257, 258)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [m for m in metrics if "student_bpb" in m]
    assert evals and all(math.isfinite(m["student_bpb"]) and m["student_bpb"] > 0 for m in evals)


@pytest.mark.parametrize(
    ("store", "extra", "says"),
    [
        ("eot", [], "reads the bytes stream, read from fused-stream stores: give --stream eot"),
        ("fused", ["--architecture", "patched"], "the bytes stream does not hold: train a flat student"),
    ],
    ids=["eot-store", "patched"],
)
def test_what_the_bytes_stream_cannot_take_is_refused_in_one_line(tmp_path, stores, capsys, store, extra, says):
    args = ["train", "--train-stores", stores[store], "--stream", "bytes", *TRAIN, *extra]
    assert cli_main([*args, "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bytedistill train: error: ") and len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path / "run").exists()


def test_a_healed_byte_of_the_bytes_stream_has_one_symbol():
    """The bytes stream places no token end: a fed prompt byte is that byte, whichever choice is made."""
    assert StreamKind.BYTES.choices(0x41) == [0x41, 0x41]
    assert StreamKind.FUSED.choices(0x41) == [0x41, FUSED_ENDS + 0x41]
