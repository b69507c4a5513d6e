"""A SentencePiece teacher's student end to end: dump, train, export, and the exported stream
tokenizer (the documented loading path) gives every stored stream and the store's score."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from logit_store import LogitStore
from students.release.score import ScoreOptions, score
from tests.exported_student import HELDOUT, build
from tests.teachers import mistral_sentencepiece_folder, phi3_style, save_tiny_teacher
from tests.test_sentencepiece import SPECIAL_TEXT

HELDOUT_SP = [
    *(t.encode() for t in HELDOUT),
    SPECIAL_TEXT,  # </s>, <s>, [INST], <|endoftext|>: text, not the teacher's controls
    b" leading space",
    b"\xff invalid \xc3( bytes \xe2\x82",
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Phi-3's layout: padded output layer, added tokens, ``</s>`` an added token that is not special.
    (The other layouts' encoding goes through the same ``TeacherTokens``, tested in test_sentencepiece.)"""
    root = tmp_path_factory.mktemp("phi3")
    tokenizer = phi3_style(mistral_sentencepiece_folder(root / "sp", "v1"))
    teacher = save_tiny_teacher(root / "teacher", tokenizer, 32_064, bos_token_id=1, eos_token_id=32_000)
    return build(root, teacher, HELDOUT_SP)


@pytest.mark.slow
def test_exported_tokenizer_gives_every_stored_stream_and_the_stores_score(exported, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(exported.folder, trust_remote_code=True)
    assert type(tokenizer).__name__ == "ByteStreamTokenizer" and tokenizer.teacher.dummy_prefix
    store = LogitStore(exported.heldout_store)
    texts = []
    for i in range(len(store)):
        layout = store.document(i).layout
        data = layout.text_bytes()
        assert tokenizer.encode_bytes(data, eos=True) == layout.symbols.tolist(), data
        if b"\xff" not in data:  # text (the one document of invalid UTF-8 aside)
            assert tokenizer(data.decode()).input_ids + [store.stream.eos] == layout.symbols.tolist()
        texts.append(tmp_path / f"{i:02d}.txt")
        texts[-1].write_bytes(data)
    assert len(store) == len(HELDOUT_SP)
    # each text file is a source of one document, windowed from its own start, as the store's
    # documents are when each is scored from its own <bos>
    from_store, from_text = (
        score(exported.folder, [exported.heldout_store], ScoreOptions(progress=False, packed=False))[-1],
        score(exported.folder, texts, ScoreOptions(progress=False))[-1],
    )
    assert from_text.bytes == from_store.bytes == sum(len(d) for d in HELDOUT_SP)
    assert from_text.student_nll == pytest.approx(from_store.student_nll, rel=1e-9)
