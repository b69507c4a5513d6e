"""``bytedistill generate`` and ``bytedistill chat`` on the decode engine (``students/serving/offline.py``):
greedy, the bytes the model's own ``generate`` gives (flat and patched, both streams, prompts cut
inside a word, more prompts than slots, a window sliding past the context); a chat student's
answers (a system prompt, the end of turn) and a conversation's turns, streamed as they come;
sampling reproducible by seed, rows of a batch drawing apart; a folder whose generation config
asks for what the engine does not apply decodes through ``generate``."""

from __future__ import annotations

import pytest

from bytestream.stream_kind import StreamKind
from students.release import chat as release_chat
from students.release import generate as release_generate
from students.release.generate_options import GenerateOptions
from students.serving import offline
from tests.test_chat_student import RESERVED, chat_tokenizer, teacher  # noqa: F401 (teacher: a fixture)
from tests.test_serving_engine import MODELS, PROMPTS, student

GREEDY = GenerateOptions(max_new_bytes=36, greedy=True)  # past the 48-symbol context of the engine tests' students


@pytest.fixture(scope="module")
def tokenizers(llama3_tokenizer_path):
    from bytestream.stream_tokenizer import ByteStreamTokenizer

    return {
        stream: ByteStreamTokenizer(teacher_tokenizer_file=llama3_tokenizer_path, byte_stream=stream)
        for stream in ("eot", "fused")
    }


@pytest.mark.parametrize("name", list(MODELS))
def test_generate_on_the_engine_gives_what_generate_gives(name, tokenizers, monkeypatch):
    monkeypatch.setattr(offline, "MAX_SLOTS", 2)  # four prompts on two slots: two join as others leave
    model = student(name)
    tokenizer = tokenizers[StreamKind.of_config(model.config).value]
    stock = release_generate.generate_batch(model, tokenizer, PROMPTS, GREEDY)
    assert offline.generate_batch(model, tokenizer, PROMPTS, GREEDY) == stock


def chat_student(architecture: str, tokenizer_json: str, tmp_path):
    from students.models.architectures import architecture_named
    from students.models.shape import StudentShape

    tokenizer = chat_tokenizer(tmp_path, tokenizer_json, "fused")
    shape = StudentShape(stream="fused", architecture=architecture, preset="micro")
    model = architecture_named(architecture).build(shape, seq_len=64, seed=0, reserved=tuple(RESERVED)).eval()
    stream = StreamKind.FUSED
    config = model.generation_config
    config.eos_token_id = [stream.eos, stream.alphabet_size + RESERVED.index("<|im_end|>")]
    config.suppress_tokens, config.pad_token_id = [stream.bos, stream.pad], stream.pad
    return model, tokenizer


@pytest.mark.parametrize("architecture", ["flat", "patched"])
def test_chat_answers_and_turns_on_the_engine_are_generates(architecture, teacher, tmp_path):  # noqa: F811
    model, tokenizer = chat_student(architecture, teacher[1], tmp_path)
    system = {"role": "system", "content": "Be brief."}
    conversations = [[system, {"role": "user", "content": q}] for q in ("What is 2+2?", "Hi", "Name a colour.")]
    options = GenerateOptions(max_new_bytes=40, greedy=True)
    ended_stock: list[bool] = []
    ended: list[bool] = []
    stock = release_chat.answers(model, tokenizer, conversations, options, ended_stock)
    assert offline.answers(model, tokenizer, conversations, options, ended) == stock and ended == ended_stock
    # a conversation: each turn streamed as it is generated, the history read again each turn
    talk = offline.conversation(model, tokenizer, options)
    assert isinstance(talk, offline.EngineConversation)
    reference = release_chat.Conversation(model, tokenizer, options, [system])
    talk.messages.append(system)
    for question in ("What is 2+2?", "And 3+3?"):
        written: list[str] = []
        reply = talk.reply(question, write=written.append)
        assert reply == reference.reply(question) and "".join(written) == reply
    assert talk.messages == reference.messages


def test_sampling_on_the_engine_is_reproducible_by_seed(tokenizers):
    model, tokenizer = student("patched-eot"), tokenizers["eot"]
    options = GenerateOptions(max_new_bytes=24, seed=5, top_k=40, top_p=0.95)
    prompts = ["And God sa", "And God sa", "In the"]
    batch = offline.generate_batch(model, tokenizer, prompts, options)
    assert offline.generate_batch(model, tokenizer, prompts, options) == batch
    assert batch[0] != batch[1]  # equal prompts, each row its own draws
    assert offline.generate_batch(model, tokenizer, prompts[:1], options) == batch[:1]  # the first row: as alone
    assert offline.generate_batch(model, tokenizer, prompts[:1], GenerateOptions(max_new_bytes=24, seed=6)) != batch[:1]


def test_a_generation_config_the_engine_cannot_apply_decodes_through_generate(tokenizers, capsys):
    model, tokenizer = student("flat-eot"), tokenizers["eot"]
    assert offline.stock_reason(model) is None
    model.generation_config.repetition_penalty = 1.5
    model.generation_config.no_repeat_ngram_size = 3
    assert offline.stock_reason(model) == "its generation config sets no_repeat_ngram_size, repetition_penalty"
    stock = release_generate.generate_batch(model, tokenizer, PROMPTS[:2], GREEDY)
    capsys.readouterr()
    assert offline.generate_batch(model, tokenizer, PROMPTS[:2], GREEDY) == stock
    assert "decoding with the model's generate, not the engine: its generation config sets" in capsys.readouterr().err


@pytest.mark.slow
def test_compiled_generate_on_the_engine_gives_the_eager_bytes(tokenizers, monkeypatch):
    """``--compile``: greedy, generate's bytes (three prompts on two slots, every step running both);
    sampled, the eager engine's draws (the sampling is part of the compiled step)."""
    monkeypatch.setattr(offline, "MAX_SLOTS", 2)
    model = student("flat-eot")
    tokenizer = tokenizers["eot"]
    prompts = PROMPTS[:3]
    compiled = GenerateOptions(max_new_bytes=20, greedy=True, compile=True)
    stock = release_generate.generate_batch(model, tokenizer, prompts, GenerateOptions(max_new_bytes=20, greedy=True))
    assert offline.generate_batch(model, tokenizer, prompts, compiled) == stock
    sampled = GenerateOptions(max_new_bytes=20, seed=3, top_k=20, top_p=0.9)
    eager = offline.generate_batch(model, tokenizer, prompts, sampled)
    sampled.compile = True
    assert offline.generate_batch(model, tokenizer, prompts, sampled) == eager
