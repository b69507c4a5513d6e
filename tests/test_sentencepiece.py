"""SentencePiece teachers as users have them (Llama-2, Mistral, Phi-3 layouts over a real
SentencePiece model from PyPI ``mistral-common``): the dummy prefix space as context, literal
special text, padded output layers, lossy normalizers, and ``check-teacher`` verdicts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer
from transformers import AutoTokenizer, LlamaTokenizer

from bytedistill.cli import main
from bytestream.vocab import BYTE_FALLBACK, vocab_from_tokenizer
from common.errors import UserError
from distill.conversion.converter import Converter
from distill.teacher.encode import DocumentEncoder
from distill.teacher.model import load_teacher
from logit_store import LogitStore
from tests.conftest import SAMPLE_DOCUMENTS, random_logits
from tests.teachers import (
    PHI3_ADDED,
    llama2_style,
    mistral_sentencepiece_folder,
    phi3_style,
    save_tiny_teacher,
)
from tests.test_convert import (
    assert_matches_reference,
    reference_context_log_mass,
    reference_distributions,
    teacher_log_likelihood,
)

SPECIAL_TEXT = b"</s><s> [INST] hi [/INST] <|endoftext|><|im_start|>user\n<|im_end|> <unk> </s>  x"
DOCUMENTS = {
    **SAMPLE_DOCUMENTS,
    "sentencepiece_specials": SPECIAL_TEXT,
    "leading_space": b" a",
    "one_space": b" ",
    "invalid_first": b"\xff a",
}
FAMILIES = ["mistral-v1-auto", "mistral-v1-llama", "llama2-json", "phi3", "mistral-v3"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentencepiece")
    return {v: mistral_sentencepiece_folder(root / v, v) for v in ("v1", "v3")}


@pytest.fixture(scope="module")
def families(folders):
    """name -> (tokenizer, vocab, encoder, converter), built once."""
    tokenizers = {
        "mistral-v1-auto": AutoTokenizer.from_pretrained(folders["v1"]),  # Replace(\A▁) + Metaspace "always"
        "mistral-v1-llama": LlamaTokenizer.from_pretrained(folders["v1"]),  # Metaspace "first"
        "llama2-json": llama2_style(folders["v1"]),  # Prepend + Replace normalizer
        "phi3": phi3_style(folders["v1"]),
        "mistral-v3": AutoTokenizer.from_pretrained(folders["v3"]),  # [INST] … control tokens
    }
    out = {}
    for name, tok in tokenizers.items():
        vocab = vocab_from_tokenizer(tok, name=name)
        out[name] = (tok, vocab, DocumentEncoder(tok, vocab), Converter(vocab))
    return out


def test_family_vocabularies(families):
    for name, (_, vocab, _, converter) in families.items():
        assert vocab.family == BYTE_FALLBACK and vocab.adds_prefix_space, name
        assert 2 in vocab.end_of_text_ids and {0, 1, 2} <= set(vocab.special_ids), name
        assert converter.trie.start_node == converter.trie.node_of_prefix(b" ") > 0
    assert families["mistral-v1-auto"][1].size == 32_000 and families["mistral-v3"][1].size == 32_768
    phi3 = families["phi3"][1]
    assert phi3.size == 32_011 and phi3.end_of_text_ids == (2, 32_000) and phi3.prefix_ids == (1,)
    assert set(range(32_000, 32_011)) <= set(phi3.special_ids)


@pytest.mark.parametrize("family", FAMILIES)
def test_encoding_is_the_teachers_own(family, families):
    """Plain text gets exactly the ids the teacher's own tokenizer gives it (dummy prefix included)."""
    tok, _, encoder, _ = families[family]
    backend = getattr(tok, "backend_tokenizer", tok)
    for name in ("english", "emoji", "cjk", "arabic", "combining", "whitespace", "code", "long_tokens"):
        text = SAMPLE_DOCUMENTS[name].decode()
        assert encoder.encode(text.encode()).tolist() == backend.encode(text, add_special_tokens=False).ids, name


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_and_literal_special_text(family, families):
    _, vocab, encoder, converter = families[family]
    for name, data in DOCUMENTS.items():
        ids = encoder.encode(data)
        assert vocab.bytes_of(ids) == b" " + data, name  # the teacher reads the dummy prefix space
        assert not set(ids.tolist()) & set(vocab.special_ids), name
        assert converter.layout(ids).text_bytes() == data, name  # the stream holds the document only
    assert encoder.encode(b"").tolist() == []


@pytest.mark.parametrize("family", ["mistral-v1-auto", "phi3"])
@pytest.mark.parametrize("name", ["sentencepiece_specials", "leading_space", "one_space", "invalid_first", "emoji"])
def test_conversion_equals_brute_force_given_the_space(family, name, families):
    _, vocab, encoder, converter = families[family]
    ids = encoder.encode(DOCUMENTS[name])
    logits = random_logits(len(ids) + 1, vocab.size, seed=len(name), peaked=name == "emoji")
    dist = converter.convert_numba(ids, logits)
    assert_matches_reference(dist, reference_distributions(vocab, ids, logits))
    context = reference_context_log_mass(vocab, ids, logits)
    assert dist.context_log_mass == pytest.approx(context, rel=1e-12)
    expected = teacher_log_likelihood(vocab, ids, logits) - context
    assert dist.log_likelihood() == pytest.approx(expected, rel=1e-9)
    on_torch = converter.convert_torch(ids, torch.from_numpy(logits))
    np.testing.assert_allclose(on_torch.values, dist.values, rtol=1e-9, atol=1e-300)
    assert on_torch.context_log_mass == pytest.approx(context, rel=1e-12)


@settings(max_examples=20, deadline=None)
@given(data=st.binary(min_size=0, max_size=48), seed=st.integers(0, 2**16))
def test_random_bytes_round_trip_and_identity(data, seed, families):
    """Any bytes (invalid UTF-8, leading spaces, empty) given the dummy prefix space."""
    _, vocab, encoder, converter = families["llama2-json"]
    ids = encoder.encode(data)
    assert vocab.bytes_of(ids) == (b" " + data if data else b"")
    logits = random_logits(len(ids) + 1, vocab.size, seed=seed)
    dist = converter.convert_numba(ids, logits)
    assert dist.layout.text_bytes() == data
    np.testing.assert_allclose(np.add.reduceat(dist.values, dist.layout.offsets[:-1]), 1.0, atol=1e-12)
    expected = teacher_log_likelihood(vocab, ids, logits) - reference_context_log_mass(vocab, ids, logits)
    assert dist.log_likelihood() == pytest.approx(expected, rel=1e-9)


def test_tiny_phi3_teacher_with_padded_output_layer(tmp_path, families, caplog):
    """Phi-3 pads its 32,011 ids to 32,064 output rows: the padding joins the dropped specials, and
    the identity holds per document through a real (tiny, random) model, in float64."""
    tok = families["phi3"][0]
    folder = save_tiny_teacher(tmp_path / "phi3", tok, vocab_size=32_064, bos_token_id=1, eos_token_id=32_000)
    teacher = load_teacher(str(folder), dtype=torch.float64)
    vocab = teacher.vocab
    assert "53 rows past the tokenizer's 32011 ids" in caplog.text
    assert vocab.size == 32_064 and vocab.output_padding == 53
    assert set(range(32_011, 32_064)) <= set(vocab.dropped_ids.tolist())
    encoder, converter = DocumentEncoder(teacher.tokenizer, vocab), Converter(vocab)
    for name in ("english", "sentencepiece_specials", "invalid_first"):
        ids = encoder.encode(DOCUMENTS[name])
        prefix = teacher.context_prefix
        input_ids = torch.tensor([prefix + ids.tolist()])
        rows = np.arange(len(prefix) - 1, len(prefix) + len(ids))
        logits = teacher.logits(input_ids, torch.ones_like(input_ids), [rows]).tensor.double().numpy()
        dist = converter.convert_numba(ids, logits)
        expected = teacher_log_likelihood(vocab, ids, logits) - reference_context_log_mass(vocab, ids, logits)
        assert dist.log_likelihood() == pytest.approx(expected, rel=1e-9), name
        padding_and_specials = np.logaddexp.reduce(logits[:, vocab.dropped_ids], axis=1)
        dropped = np.exp(padding_and_specials - np.logaddexp.reduce(logits, axis=1))
        np.testing.assert_allclose(dist.dropped_mass, dropped, rtol=1e-9)
    assert_matches_reference(dist, reference_distributions(vocab, ids, logits))


def test_output_layer_smaller_than_the_tokenizer_is_refused(tmp_path, families):
    folder = save_tiny_teacher(tmp_path / "small", families["phi3"][0], vocab_size=32_000)
    with pytest.raises(UserError, match="only 32000 rows"):
        load_teacher(str(folder))


def test_phi3_end_of_sentence_text_is_text(families):
    tok, vocab, encoder, _ = families["phi3"]
    assert 2 in tok.backend_tokenizer.encode("a </s> b", add_special_tokens=False).ids  # the teacher's own way
    ids = encoder.encode(b"a </s>  b")
    assert 2 not in ids.tolist() and vocab.bytes_of(ids) == b" a </s>  b"
    for name in PHI3_ADDED:
        assert vocab.bytes_of(encoder.encode(name.encode())) == b" " + name.encode()


def test_lossy_normalizers_are_refused_by_byte_and_rule(families, folders):
    _, _, encoder, _ = families["llama2-json"]
    with pytest.raises(UserError, match=r"byte 4 \(0xE2\) is changed by SentencePiece's reading of '▁'"):
        encoder.encode("word\u2581piece".encode())
    spec = json.loads(families["llama2-json"][0].backend_tokenizer.to_str())
    spec["normalizer"]["normalizers"].append({"type": "NFKC"})  # after the undoable space → ▁
    nfkc = Tokenizer.from_str(json.dumps(spec))
    vocab = vocab_from_tokenizer(nfkc, end_of_text=["</s>"])
    encoder = DocumentEncoder(nfkc, vocab)
    assert vocab.bytes_of(encoder.encode(b"plain text")) == b" plain text"  # unchanged text is fine
    with pytest.raises(UserError, match=r"byte 6 \(0xEF\) is changed by the tokenizer's NFKC normalizer"):
        encoder.encode("fine, ﬁne".encode())


def test_check_teacher_verdicts(tmp_path, folders, families, capsys):
    assert main(["check-teacher", str(folders["v3"])]) == 0
    out = capsys.readouterr().out
    assert "sentencepiece-byte-fallback" in out and "dummy prefix" in out and "32,768 ids" in out
    assert out.strip().splitlines()[-1].startswith("verdict: OK")

    folder = save_tiny_teacher(tmp_path / "phi3", families["phi3"][0], vocab_size=32_064)
    assert main(["check-teacher", str(folder)]) == 0
    assert "32,064 rows (53 padding rows" in capsys.readouterr().out

    spec = json.loads(families["llama2-json"][0].backend_tokenizer.to_str())
    spec["normalizer"]["normalizers"].insert(0, {"type": "Lowercase"})
    lossy = tmp_path / "lowercase.json"
    lossy.write_text(json.dumps(spec))
    assert main(["check-teacher", str(lossy), "--end-of-text", "</s>"]) == 2
    captured = capsys.readouterr()
    assert "verdict:" not in captured.out
    [line] = captured.err.strip().splitlines()
    assert line.startswith("bytedistill check-teacher: error: FAILED") and "Lowercase normalizer" in line


@pytest.mark.slow
def test_check_teacher_on_llama3(llama3_tokenizer_path, capsys):
    assert main(["check-teacher", llama3_tokenizer_path]) == 0
    out = capsys.readouterr().out
    assert "byte-level" in out and "prefix handling  none" in out and out.strip().endswith("can be distilled exactly")


@pytest.mark.slow
@pytest.mark.parametrize("stream", ["eot", "fused"])
def test_dump_of_a_padded_sentencepiece_teacher(tmp_path, families, stream):
    """``dump`` end to end, on either stream: the store gives back each document's bytes (not the
    added space), its byte count, and the stream NLL of the teacher given the space (whose mass each
    stream counts at its own node)."""
    folder = save_tiny_teacher(tmp_path / "phi3", families["phi3"][0], vocab_size=32_064, bos_token_id=1)
    documents = {"a.txt": b" leading space", "b.txt": SPECIAL_TEXT, "c.txt": b"\xff a \xc3("}
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name, data in documents.items():
        (corpus / name).write_bytes(data)
    args = [
        "--corpus",
        str(corpus),
        "--output",
        str(tmp_path / "store"),
        "--encoding",
        "float16",
        "--progress",
        "false",
        "--stream",
        stream,
    ]
    assert main(["dump", "--teacher", str(folder), *args]) == 0
    store = LogitStore(tmp_path / "store")
    teacher = load_teacher(str(folder), dtype=torch.float64)
    assert store.vocab.hash == teacher.vocab.hash and len(store) == len(documents)
    encoder = DocumentEncoder(teacher.tokenizer, teacher.vocab)
    for i in range(len(store)):
        doc = store.document(i)
        data = documents[Path(doc.key).name]
        assert doc.layout.text_bytes() == data and doc.text_bytes == len(data)
        ids = encoder.encode(data)  # the ids the teacher read (the store keeps one id per byte string)
        assert teacher.vocab.bytes_of(doc.token_ids) == teacher.vocab.bytes_of(ids)
        input_ids = torch.tensor([teacher.context_prefix + ids.tolist()])
        rows = np.arange(len(ids) + 1)
        logits = teacher.logits(input_ids, torch.ones_like(input_ids), [rows]).tensor.double().numpy()
        from tests.test_convert_fused import reference_fused_context  # it imports this module
        from tests.test_dump_fused import float16_log_error

        context = reference_fused_context if stream == "fused" else reference_context_log_mass
        expected = teacher_log_likelihood(teacher.vocab, ids, logits) - context(teacher.vocab, ids, logits)
        targets = doc.target_probabilities().astype(np.float64)
        bound = float16_log_error(targets).sum()  # float16's steps, subnormal ones included
        assert float(np.log(targets).sum()) == pytest.approx(expected, rel=1e-3, abs=bound)
