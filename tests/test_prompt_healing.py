"""Prompts: the teacher's tokens up to the last word, that word's bytes fed with the model choosing
where ``<eot>`` goes (``HealingProcessor``), through ``tokenizer.prompt`` + ``model.generate`` and
``bytedistill generate`` alike, for byte-level and SentencePiece teachers."""

from __future__ import annotations

import itertools
import json

import pytest
import torch
from transformers import AutoTokenizer

from bytestream.alphabet import BOS, EOS, EOT, NUM_BYTES, PAD
from bytestream.stream_tokenizer import ByteStreamTokenizer
from bytestream.teacher_tokens import TeacherTokens
from bytestream.vocab import vocab_from_tokenizer
from distill.teacher.encode import with_specials_marked
from students.models.llama import build_student, student_config
from students.release.generate import GenerateOptions, generate_bytes
from tests.teachers import llama2_style, mistral_sentencepiece_folder, phi3_style

LLAMA3_PROMPTS = {  # prompt -> (committed teacher tokens, the last word's bytes)
    "In the begi": ([b"In", b" the"], b" begi"),
    "In the beginning God creat": ([b"In", b" the", b" beginning", b" God"], b" creat"),
    "And God sa": ([b"And", b" God"], b" sa"),
    "And God said": ([b"And", b" God"], b" said"),
    "And God said, ": ([b"And", b" God", b" said", b","], b" "),
    "x = f(a1": ([b"x", b" =", b" f", b"(a"], b"1"),
    "": ([], b""),
}


@pytest.fixture(scope="module")
def stream_tokenizer(llama3_tokenizer_path):
    return ByteStreamTokenizer(teacher_tokenizer_file=llama3_tokenizer_path)


@pytest.fixture(scope="module")
def student():
    config = student_config("tiny", hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_positions=96)
    model = build_student(config, seed=0).eval()
    model.generation_config.pad_token_id = PAD
    return model


def test_a_prompt_is_committed_up_to_its_last_word(stream_tokenizer):
    teacher = stream_tokenizer.teacher
    for prompt, expected in LLAMA3_PROMPTS.items():
        data = prompt.encode()
        committed, open_bytes = teacher.split_prompt(data)
        assert (committed, open_bytes) == expected, prompt
        assert teacher.streamed_tokens(data)[: len(committed)] == committed  # the complete text's own tokens
        symbols, same_bytes = stream_tokenizer.encode_prompt(data)
        assert symbols[0] == BOS and symbols.count(EOT) == len(committed) and same_bytes == open_bytes
    assert teacher.split_prompt(b"caf\xc3") == ([b"caf"], b"\xc3")  # a cut character: its invalid byte


@pytest.fixture(scope="module")
def sentencepiece_folder(tmp_path_factory):
    return mistral_sentencepiece_folder(tmp_path_factory.mktemp("sp") / "v1", "v1")


@pytest.mark.parametrize("layout", [llama2_style, AutoTokenizer.from_pretrained, phi3_style])
def test_sentencepiece_prompts_split_at_the_last_space(layout, sentencepiece_folder):
    """Llama-2's layout has no pre-tokenizer (one pre-token: a space starts a word), Mistral's
    splits at spaces (Metaspace), Phi-3's adds tokens; the dummy prefix space is context."""
    tok = layout(sentencepiece_folder)
    vocab = vocab_from_tokenizer(tok)
    spec = with_specials_marked(json.loads(tok.backend_tokenizer.to_str()), vocab)
    teacher = TeacherTokens(json.dumps(spec))
    assert teacher.dummy_prefix
    assert teacher.split_prompt(b"In the begi") == ([b"In", b" the"], b" begi")  # the dummy space is context
    assert teacher.split_prompt(b"begi") == ([], b"begi")
    assert teacher.split_prompt(b"a </s>  x") == (teacher.streamed_tokens(b"a </s>  x")[:-1], b" x")
    single = [teacher.single_byte_id(b) for b in range(0x80, 0x100)]
    assert single == vocab.single_byte_ids[0x80:].tolist()  # invalid UTF-8: the dump's byte tokens


def test_invalid_bytes_take_the_dumps_byte_tokens(stream_tokenizer, llama3_vocab):
    single = [stream_tokenizer.teacher.single_byte_id(b) for b in range(0x80, 0x100)]
    assert single == llama3_vocab.single_byte_ids[0x80:].tolist()


def test_healing_feeds_the_word_and_the_model_places_eot(stream_tokenizer, student):
    prompt = "In the beginning God creat"
    inputs = stream_tokenizer.prompt(prompt)
    start = inputs["input_ids"].shape[1]
    output = student.generate(**inputs, max_new_tokens=40, do_sample=False)[0].tolist()
    open_bytes = LLAMA3_PROMPTS[prompt][1]
    produced, at = 0, start
    while produced < len(open_bytes):  # each forced step: the model's own pick of byte vs <eot>
        logits = student(input_ids=torch.tensor([output[:at]])).logits[0, -1]
        allowed = [open_bytes[produced]] + ([EOT] if output[at - 1] not in (EOT, BOS) else [])
        assert output[at] == max(allowed, key=lambda s: logits[s].item()), at
        produced += output[at] < NUM_BYTES
        at += 1
    assert bytes(s for s in output[start:at] if s < NUM_BYTES) == open_bytes
    assert stream_tokenizer.decode(output, skip_special_tokens=True).startswith(prompt)
    assert all(b != EOT or a not in (EOT, BOS) for a, b in itertools.pairwise(output))  # no empty token


def test_batched_prompts_and_bytedistill_generate_heal_alike(stream_tokenizer, student):
    prompts = ["In the begi", "And God said, "]
    student.generation_config.suppress_tokens = [BOS, EOS, PAD]  # run to the byte budget
    inputs = stream_tokenizer.prompt(prompts)
    assert inputs["attention_mask"][0, 0] == 0 and inputs["input_ids"][0, 0] == PAD  # padded on the left
    output = student.generate(**inputs, max_new_tokens=30, do_sample=False)
    for row, prompt in enumerate(prompts):
        text = stream_tokenizer.decode(output[row], skip_special_tokens=True).encode()
        assert text.startswith(prompt.encode())
        continuation = generate_bytes(student, stream_tokenizer, prompt, GenerateOptions(max_new_bytes=8, greedy=True))
        alone = student.generate(**stream_tokenizer.prompt(prompt), max_new_tokens=30, do_sample=False)[0]
        alone_text = stream_tokenizer.decode(alone, skip_special_tokens=True).encode()
        assert len(continuation) == 8 and alone_text[len(prompt) :].startswith(continuation)


def test_which_rows_the_remote_generate_heals(stream_tokenizer):
    """Rows that are the stream tokenizer's encoding of their bytes, also cut on the left (as
    lm-evaluation-harness truncates long prompts); plain bytes and foreign rows pass unchanged."""
    split = stream_tokenizer._split_stream
    data = b"And God said, Let there be light: and there was li"
    row = stream_tokenizer.encode_bytes(data)
    committed, open_bytes = stream_tokenizer.encode_prompt(data)
    assert split(row) == (committed, open_bytes) and open_bytes == b" li"
    cut = row[5:]  # starts inside a token
    assert split(cut) == (cut[: len(committed) - 5], b" li")
    plain = [BOS, *data]
    assert split(plain) == (plain, b"") and split([BOS, 65, EOT, 66]) == ([BOS, 65, EOT, 66], b"")
