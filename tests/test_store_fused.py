"""Fused-stream stores (logit_store/FORMAT.md, "Streams"): the rows read back as written, within each
encoding's quantisation; the manifest names the stream, and stores of two streams never mix."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from bytedistill.cli import main as cli_main
from bytestream.alphabet import FUSED_ALPHABET_SIZE
from bytestream.stream_kind import StreamKind
from common.errors import UserError
from logit_store import ENCODINGS, LogitStore, StoreIdentity, StoreWriter, kl_bits_per_position, open_stores
from logit_store.manifest import read_manifest
from students.training.batch_source import refuse_other_streams
from tests.test_store import KL_BOUNDS, llama3, open_store, random_documents, write_store  # noqa: F401 (fixture)

STORE_DATA = Path(__file__).resolve().parent / "data"
# KL(exact || decoded) in bits per position: twice the <eot> store's bounds, since a fused root
# position holds both halves (goes on, ends) of each first byte, up to twice an <eot> root's values,
# each rounded on its own (measured: pow12 2.3e-6 mean against the <eot> store's bound of 2e-6)
FUSED_KL_BOUNDS = {name: (2 * mean, 2 * most) for name, (mean, most) in KL_BOUNDS.items()}


@pytest.fixture(scope="module")
def fused_documents(llama3):  # noqa: F811
    """Exact fused distributions of TEXTS under the random logits of tests/test_store.py's documents."""
    return random_documents(llama3, fused=True)


def write_fused(directory, llama3, documents, encoding="pow8", **kwargs):  # noqa: F811
    return write_store(directory, llama3, documents, encoding, stream=StreamKind.FUSED, **kwargs)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_fused_round_trip_every_encoding(tmp_path, llama3, fused_documents, encoding):  # noqa: F811
    """Every document reads back as the fused stream it was written as: one position per text byte
    (and the ``<bos>`` one), its supports, and its values within the encoding's quantisation (the
    ``<eot>`` store's KL bounds for twice the values at a root position)."""
    store = open_store(write_fused(tmp_path / "s", llama3, fused_documents, encoding), llama3)
    assert store.stream is StreamKind.FUSED and len(store) == len(fused_documents)
    kls = []
    for k, (ids, dist, nbytes) in enumerate(fused_documents):
        doc = store.document(k)
        np.testing.assert_array_equal(doc.token_ids, ids)
        assert doc.layout.fused and doc.num_positions == nbytes + 1 == doc.text_bytes + 1
        np.testing.assert_array_equal(doc.layout.symbols, dist.layout.symbols)
        np.testing.assert_array_equal(doc.layout.support, dist.layout.support)
        np.testing.assert_array_equal(doc.layout.offsets, dist.layout.offsets)
        np.testing.assert_allclose(doc.dropped_mass, dist.dropped_mass, rtol=2**-8)  # bfloat16
        assert doc.values.dtype == np.float32 and np.all(doc.values > 0)
        if encoding == "float16":
            np.testing.assert_allclose(doc.values, dist.values, rtol=2e-3, atol=1e-7)
        kls.append(kl_bits_per_position(dist.values, doc.values, dist.layout.offsets))
        dense = doc.dense()
        assert dense.shape == (doc.num_positions, FUSED_ALPHABET_SIZE)
        np.testing.assert_allclose(dense.sum(1), 1.0, atol=1e-5)
    kl = np.concatenate(kls)
    mean_bound, max_bound = FUSED_KL_BOUNDS[encoding]
    assert kl.mean() <= mean_bound and kl.max() <= max_bound, (kl.mean(), kl.max())


def test_fused_entropy_coded_values_equal_plain_codes(tmp_path, llama3, fused_documents):  # noqa: F811
    """pow8-ans over the 515-symbol alphabet stores exactly the pow8 codes."""
    plain = open_store(write_fused(tmp_path / "plain", llama3, fused_documents, "pow8"), llama3)
    coded = open_store(write_fused(tmp_path / "coded", llama3, fused_documents, "pow8-ans", chunk_bytes=30_000), llama3)
    for k in range(len(fused_documents)):
        np.testing.assert_array_equal(plain.document(k).values, coded.document(k).values)
        np.testing.assert_array_equal(plain.encoded_document(k).value_bytes, coded.encoded_document(k).value_bytes)


def test_the_manifest_names_the_stream(tmp_path, llama3, fused_documents):  # noqa: F811
    """A fused store is format version 3 naming its stream; an <eot> store is written as before
    (version 2, no stream), and a store of version 1 or 2 reads as <eot>."""
    fused = read_manifest(write_fused(tmp_path / "fused", llama3, fused_documents[:2]))
    assert fused["format_version"] == 3 and fused["stream"] == "fused"
    eot = read_manifest(write_store(tmp_path / "eot", llama3, []))
    assert eot["format_version"] == 2 and "stream" not in eot
    for old in sorted(STORE_DATA.glob("store-v*")):
        assert LogitStore(old).stream is StreamKind.EOT, old
        refuse_other_streams([str(old)])  # train takes it, as a store of its student's stream


@pytest.mark.parametrize(
    "edit", [{"stream": "eot"}, {"stream": "other"}, {"stream": ["fused"]}, {"stream": None}, {"format_version": 2}]
)
def test_a_manifest_whose_stream_and_version_disagree_is_refused(tmp_path, llama3, fused_documents, edit):  # noqa: F811
    store = write_fused(tmp_path / "s", llama3, fused_documents[:1])
    manifest = read_manifest(store) | edit
    (store / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(UserError, match="corrupt manifest \\(stream"):
        LogitStore(store)


def test_a_writer_of_the_other_stream_is_refused_naming_both(tmp_path, llama3, fused_documents):  # noqa: F811
    store = write_fused(tmp_path / "s", llama3, fused_documents[:2])
    eot = StoreIdentity(llama3[0], encoding="pow8", teacher="random-llama3", settings={"t": 1.0}, corpus_hash="c0ffee")
    with pytest.raises(UserError) as refused:
        StoreWriter(store, eot)
    message = str(refused.value)
    assert "(stream differ)" in message and "holds the fused stream, this run writes the <eot> stream" in message
    with StoreWriter(store, dataclasses.replace(eot, stream=StreamKind.FUSED), trie=llama3[1].trie) as resumed:
        assert resumed.num_existing_documents == 2
        with pytest.raises(ValueError, match="<eot> stream for a store of the fused stream"):
            ids = fused_documents[0][0]
            resumed.add_distributions(
                llama3[1].convert_numba(ids, np.zeros((len(ids) + 1, llama3[0].size))), token_ids=ids
            )


def test_stores_of_two_streams_are_not_read_together(tmp_path, llama3, fused_documents):  # noqa: F811
    fused = write_fused(tmp_path / "fused", llama3, fused_documents[:1])
    eot = write_store(tmp_path / "eot", llama3, [])
    with pytest.raises(UserError, match="hold different streams \\(<eot> vs fused\\)"):
        open_stores([eot, fused])


def test_inspect_and_verify_show_the_stream(tmp_path, llama3, fused_documents, capsys):  # noqa: F811
    store = write_fused(tmp_path / "s", llama3, fused_documents)
    assert cli_main(["inspect", str(store)]) == 0
    assert "stream:          fused" in capsys.readouterr().out
    assert cli_main(["inspect", str(store), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stream"] == "fused"
    assert cli_main(["verify", str(store)]) == 0
    assert "positions of the fused stream verified" in capsys.readouterr().out
    assert cli_main(["verify", str(store), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stream"] == "fused"
