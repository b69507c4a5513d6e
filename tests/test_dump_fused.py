"""``dump --stream fused`` with a tiny random Llama-3 teacher: the stored rows are the fused
conversion of the teacher's own rows, and their product along the text is the teacher's
probability of its tokens; ``--stream eot`` writes the store it always did."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from bytedistill.cli import main as cli_main
from bytestream.stream_kind import StreamKind
from distill.conversion.converter import Converter
from distill.teacher.windows import plan_windows
from logit_store import LogitStore
from logit_store.manifest import read_manifest
from tests.teachers import dump_args
from tests.test_dump import DOCUMENTS, corpus_dir, teacher_dir, teacher_token_nll  # noqa: F401 (fixtures)

BOS_ID = 128_000
MAX_LENGTH, STRIDE = 64, 16  # dump_args's windows


def teacher_rows(model, token_ids: np.ndarray) -> np.ndarray:
    """The teacher's (m+1, V) float32 logits of a document, each row from the window the dump
    takes it from (its BOS before the tokens)."""
    rows = np.empty((len(token_ids) + 1, model.config.vocab_size), np.float32)
    for w in plan_windows(len(token_ids), 1, MAX_LENGTH, STRIDE):
        ids = torch.tensor([[BOS_ID, *token_ids[w.token_start : w.token_stop]]])
        with torch.no_grad():
            logits = model(ids).logits[0].float().numpy()
        rows[w.row_start : w.row_stop] = logits[w.row_start - w.token_start : w.row_stop - w.token_start]
    return rows


def float16_log_error(p: np.ndarray) -> np.ndarray:
    """How far log p can move in a float16 store: half a step (2^-11 of a normal value), twice over
    for the renormalisation, and for a subnormal value (under 2^-14) half its absolute step of 2^-24."""
    return 2.0**-10 + 2.0**-25 / p


@pytest.mark.parametrize("conversion", ["numba", "torch"])
def test_fused_dump_stores_the_fused_conversion_of_the_teacher(conversion, teacher_dir, corpus_dir, tmp_path, capsys):  # noqa: F811
    """Every stored row equals Converter.convert_fused_numba of the teacher's logits within float16,
    there is one position per text byte (and the <bos> one), and Σ log P(next fused symbol) is the
    teacher's token log-likelihood (the identity): exactly for the converted rows, and within the
    store's quantisation for the stored ones (``torch`` is the CUDA code path on CPU tensors)."""
    out = tmp_path / "store"
    args = ["--stream", "fused", "--encoding", "float16", "--conversion", conversion, "--head-rows", "37"]
    assert cli_main(dump_args(teacher_dir, corpus_dir, out, *args)) == 0
    assert "teacher BPB" in capsys.readouterr().out
    store = LogitStore(out)
    assert store.stream is StreamKind.FUSED and read_manifest(out)["stream"] == "fused" and len(store) == 4
    model = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    converter = Converter(store.vocab, store.trie)
    texts = {}
    for i in range(len(store)):
        doc = store.document(i)
        name = doc.key.rsplit("/", 1)[-1]
        texts[name] = doc.layout.text_bytes()
        assert doc.layout.fused and doc.num_positions == len(texts[name]) + 1
        exact = converter.convert_fused_numba(doc.token_ids, teacher_rows(model, doc.token_ids))
        np.testing.assert_array_equal(doc.layout.support, exact.layout.support)
        np.testing.assert_allclose(doc.values, exact.values, rtol=2e-3, atol=1e-6)
        np.testing.assert_allclose(doc.dropped_mass, exact.dropped_mass, rtol=2**-8, atol=1e-9)
        vocab = store.vocab
        expected = teacher_token_nll(
            model, doc.token_ids, BOS_ID, vocab.end_of_text_ids, vocab.special_ids, MAX_LENGTH, STRIDE
        )
        assert -exact.log_likelihood() == pytest.approx(expected, rel=1e-9), name  # the identity, in float64
        stored, target = doc.target_probabilities().astype(np.float64), exact.target_probabilities()
        bound = float16_log_error(target)
        assert np.all(np.abs(np.log(stored) - np.log(target)) <= bound), name
        assert -np.log(stored).sum() == pytest.approx(expected, abs=bound.sum()), name  # within the quantisation
    assert texts == {k: v for k, v in DOCUMENTS.items() if v}


def test_stream_eot_is_the_store_of_before_and_auto_keeps_a_stores_stream(teacher_dir, corpus_dir, tmp_path, capsys):  # noqa: F811
    """``--stream eot`` writes the store every dump wrote before the fused stream (a version-2
    manifest that names no stream); without ``--stream`` (auto) a new store is fused, and a rerun over
    an existing ``<eot>`` store keeps it one, byte for byte, where ``--stream fused`` is refused."""
    new, eot = tmp_path / "new", tmp_path / "eot"
    assert cli_main(dump_args(teacher_dir, corpus_dir, eot, "--stream", "eot")) == 0
    manifest = read_manifest(eot)
    assert manifest["format_version"] == 2 and "stream" not in manifest
    assert LogitStore(eot).stream is StreamKind.EOT
    written = {p.name: p.read_bytes() for p in eot.iterdir()}
    assert cli_main(dump_args(teacher_dir, corpus_dir, eot)) == 0
    assert {p.name: p.read_bytes() for p in eot.iterdir()} == written
    assert cli_main(dump_args(teacher_dir, corpus_dir, eot, "--stream", "fused")) == 2
    assert cli_main(dump_args(teacher_dir, corpus_dir, new)) == 0
    capsys.readouterr()
    assert LogitStore(new).stream is StreamKind.FUSED and read_manifest(new)["stream"] == "fused"


def test_fused_dump_in_the_default_encoding_verifies(teacher_dir, corpus_dir, tmp_path, capsys):  # noqa: F811
    """The entropy-coded default (pow8-ans over the 515-symbol alphabet) holds the pow8 codes of
    the same rows, and ``verify`` reads it whole."""
    coded, plain = tmp_path / "coded", tmp_path / "plain"
    assert cli_main(dump_args(teacher_dir, corpus_dir, coded, "--stream", "fused")) == 0
    assert cli_main(dump_args(teacher_dir, corpus_dir, plain, "--stream", "fused", "--encoding", "pow8")) == 0
    assert cli_main(["verify", str(coded)]) == 0
    assert "positions of the fused stream verified" in capsys.readouterr().out
    a, b = LogitStore(coded), LogitStore(plain)
    assert a.encoding.name == "pow8-ans" and len(a) == len(b) == 4
    for i in range(len(a)):
        np.testing.assert_array_equal(a.encoded_document(i).value_bytes, b.encoded_document(i).value_bytes)
