"""The GGUF export run by real llama.cpp (``llama-cpp-python``, the test extra): its own tokenizer
reads each byte as its token, its next-byte distributions match ``transformers``' on the same
prompts, and greedy decoding writes the same bytes, for a plain and a chat bytes student
(docs/DESIGN.md, "GGUF export")."""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from contextlib import contextmanager

import llama_cpp
import numpy as np
import pytest
import torch

from bytestream.alphabet import BYTES_BOS, BYTES_EOS
from common.errors import UserError
from students.release.gguf_export import GGUF_TYPES, export_gguf
from tests.bytes_student import CHAT_TEMPLATE, END_OF_TURN, save_chat_student, save_plain_student

TEXTS = [
    "Hello, world!",
    "  two  spaces , then ? and !\n\nnewlines\ttabs\r\n",
    "Grüße, wörld ✓ 東京 السلام 🙂 👨‍👩‍👧‍👦 e\u0301",
    "don't 's 1234567 x=[a**2 for _ in range(10)]",
    "<bos> and <|im_end|> as plain text",
]
PROMPT = "And God said, Let there be light: and there was light."
CONVERSATIONS = [[{"role": "user", "content": f"Tell me about the light, {n}."}] for n in range(1, 9)]
MIN_ANSWER = 16  # the bytes a chat answer that ends its turn writes first, at least
GREEDY_BYTES = 256  # the greedy continuation asked for, unless a stop comes first
MIN_GREEDY = 200  # the bytes a continuation that is compared must run, at least
F32_KL_BITS = 1e-5  # the largest per-position KL allowed for f32 weights
QUANTIZED_KL_BITS = 0.05  # a loose bound on the mean per-position KL for f16 and q8_0


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A plain student's folder and its GGUF of each type."""
    folder = save_plain_student(tmp_path_factory.mktemp("plain") / "student")
    return folder, {kind: export_gguf(folder, folder.parent / f"student.{kind}.gguf", kind) for kind in GGUF_TYPES}


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    """A chat student, its GGUFs, a conversation its greedy answer to which runs the whole
    continuation and one whose answer ends the turn."""
    root = tmp_path_factory.mktemp("chat")
    folder, long_chat, stopping_chat = chat_student_that_stops(root)
    ggufs = {kind: export_gguf(folder, root / f"student.{kind}.gguf", kind) for kind in GGUF_TYPES}
    return folder, ggufs, long_chat, stopping_chat


def chat_student_that_stops(root):
    """The chat student whose end-of-turn row is a byte's, found so that the greedy answer to one
    conversation runs GREEDY_BYTES and the answer to a later one ends the turn: a byte that the
    second answer writes (MIN_ANSWER bytes in or later) and the first does not, as the student
    whose turns never end answers them; with the two conversations."""
    never_ends = save_chat_student(root / "never-ends")
    answers = (hf_greedy(never_ends, messages) for messages in CONVERSATIONS)
    long_chat, long_answer = next((i, answer) for i, answer in enumerate(answers) if len(answer) == GREEDY_BYTES)
    for i, answer in enumerate(answers, start=long_chat + 1):
        firsts = {byte: at for at, byte in reversed(list(enumerate(answer)))}  # each byte's first place
        for stop_byte, at in sorted(firsts.items(), key=lambda item: item[1]):
            if at < MIN_ANSWER or stop_byte in long_answer or stop_byte >= 256:
                continue
            folder = save_chat_student(root / f"ends-at-{stop_byte}", stop_byte=stop_byte)
            stopping = hf_greedy(folder, CONVERSATIONS[i])
            if stopping[-1] == END_OF_TURN and len(hf_greedy(folder, CONVERSATIONS[long_chat])) == GREEDY_BYTES:
                return folder, CONVERSATIONS[long_chat], CONVERSATIONS[i]
    raise AssertionError("no byte ends one chat answer and leaves another running")


@functools.cache
def hf_model(folder):
    """The folder's model and tokenizer in ``transformers`` (each folder loaded once)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(
        folder
    )


def chat_ids(tokenizer, messages) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)
    return list(ids["input_ids"])


def hf_greedy(folder, prompt) -> list[int]:
    """``transformers``' greedy continuation of a text (or a conversation's prompt), with the
    stops of the folder's generation config."""
    model, tokenizer = hf_model(folder)
    ids = chat_ids(tokenizer, prompt) if isinstance(prompt, list) else tokenizer(prompt)["input_ids"]
    out = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY_BYTES, do_sample=False)
    return out[0, len(ids) :].tolist()


def without_weight_repacking():
    """llama.cpp's model parameters with weight repacking off (its ``--no-repack``): on a CPU with
    AMX, llama.cpp's AMX buffers take the q8_0 matrices and crash the process on a student this
    narrow (README, "GGUF"); the plain CPU path reads the file as written."""
    params = DEFAULT_MODEL_PARAMS()
    params.use_extra_bufts = False
    return params


DEFAULT_MODEL_PARAMS = llama_cpp.llama_cpp.llama_model_default_params


@contextmanager
def llama(path):
    """llama.cpp on a GGUF: every position's logits kept, an f32 cache, two threads, fixed seed,
    no weight repacking."""
    low_level = llama_cpp.llama_cpp
    low_level.llama_model_default_params = without_weight_repacking  # what Llama() starts its parameters from
    try:
        model = llama_cpp.Llama(
            str(path),
            n_ctx=512,
            n_batch=512,
            logits_all=True,
            type_k=llama_cpp.GGML_TYPE_F32,
            type_v=llama_cpp.GGML_TYPE_F32,
            n_threads=2,
            seed=0,
            verbose=False,
        )
    finally:
        low_level.llama_model_default_params = DEFAULT_MODEL_PARAMS
    try:
        yield model
    finally:
        model.close()


def llama_greedy(model, ids: list[int]) -> list[int]:
    """llama.cpp's greedy sampler from ``ids`` until a token its vocabulary ends generation with,
    or GREEDY_BYTES tokens (the stop token kept, as ``transformers`` keeps it)."""
    vocab = llama_cpp.llama_model_get_vocab(model.model)
    out = []
    for token in model.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
        out.append(token)
        if llama_cpp.llama_vocab_is_eog(vocab, token) or len(out) == GREEDY_BYTES:
            return out
    return out


def kl_bits(reference: np.ndarray, other: np.ndarray) -> np.ndarray:
    """KL(reference || other) in bits at each position, from two (positions, vocabulary) logit arrays."""
    p = reference - np.logaddexp.reduce(reference, axis=1, keepdims=True)
    q = other - np.logaddexp.reduce(other, axis=1, keepdims=True)
    return (np.exp(p) * (p - q)).sum(axis=1) / np.log(2)


def compared_ids(folder, chats) -> list[int]:
    """The ids whose next-byte distributions are compared: a text of many scripts after ``<bos>``,
    or a chat student's first conversation's prompt and its greedy answer."""
    _, tokenizer = hf_model(folder)
    if chats:
        return chat_ids(tokenizer, chats[0]) + hf_greedy(folder, chats[0])
    return tokenizer(PROMPT + TEXTS[2])["input_ids"]


def position_kl(folder, path, ids: list[int]) -> np.ndarray:
    """The per-position KL of llama.cpp's next-byte distributions from ``transformers``' on ``ids``."""
    model, _ = hf_model(folder)
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0].double().numpy()
    with llama(path) as runtime:
        runtime.eval(ids)
        theirs = np.array(runtime.scores[: len(ids)], dtype=np.float64)
    return kl_bits(reference, theirs)


def test_llama_cpp_reads_each_byte_as_its_own_token(plain):
    """Text reads as its bytes (and back); both runtimes put ``<bos>`` first, and both read a
    special's name in the text as that special where asked to (``transformers`` always does)."""
    folder, ggufs = plain
    _, tokenizer = hf_model(folder)
    with llama(ggufs["f32"]) as runtime:
        for text in TEXTS:
            ids = runtime.tokenize(text.encode(), add_bos=False, special=False)
            assert ids == list(text.encode()), text
            assert runtime.detokenize(ids) == text.encode()
            assert runtime.tokenize(text.encode()) == [BYTES_BOS, *text.encode()]
            assert runtime.tokenize(text.encode(), special=True) == tokenizer(text)["input_ids"]
        assert runtime.detokenize(list(range(256))) == bytes(range(256))  # any bytes out, valid UTF-8 or not
    assert tokenizer(TEXTS[-1])["input_ids"][:3] == [BYTES_BOS, BYTES_BOS, ord(" ")]


def test_chat_prompt_reads_the_same_in_llama_cpp(chat):
    """The template's text, with its specials parsed, is the ids of ``apply_chat_template``."""
    folder, ggufs, long_chat, _ = chat
    _, tokenizer = hf_model(folder)
    rendered = tokenizer.apply_chat_template(long_chat, add_generation_prompt=True, tokenize=False)
    with llama(ggufs["f32"]) as runtime:
        assert runtime.tokenize(rendered.encode(), add_bos=False, special=True) == chat_ids(tokenizer, long_chat)


def test_the_gguf_carries_the_chat_template_and_end_of_turn(chat):
    import gguf

    _, ggufs, *_ = chat
    fields = gguf.GGUFReader(ggufs["q8_0"]).fields
    text = fields["tokenizer.chat_template"]
    assert bytes(text.parts[text.data[0]]).decode() == CHAT_TEMPLATE
    assert int(fields["tokenizer.ggml.eot_token_id"].parts[-1][0]) == END_OF_TURN
    assert int(fields["tokenizer.ggml.eos_token_id"].parts[-1][0]) == BYTES_EOS
    assert bool(fields["tokenizer.ggml.add_bos_token"].parts[-1][0])


@pytest.mark.parametrize("student", ["plain", "chat"])
def test_f32_next_byte_distributions_match_transformers(student, request):
    folder, ggufs, *chats = request.getfixturevalue(student)
    ids = compared_ids(folder, chats)
    kl = position_kl(folder, ggufs["f32"], ids)
    print(f"{student} f32: KL max {kl.max():.2e}, mean {kl.mean():.2e} bits per byte over {len(ids)} positions")
    assert kl.max() <= F32_KL_BITS


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
@pytest.mark.parametrize("student", ["plain", "chat"])
def test_quantized_distributions_stay_close(student, kind, request):
    folder, ggufs, *chats = request.getfixturevalue(student)
    kl = position_kl(folder, ggufs[kind], compared_ids(folder, chats))
    print(f"{student} {kind}: KL max {kl.max():.2e}, mean {kl.mean():.2e} bits per byte over {len(kl)} positions")
    assert kl.mean() <= QUANTIZED_KL_BITS


def test_greedy_continuation_is_byte_identical(plain):
    folder, ggufs = plain
    _, tokenizer = hf_model(folder)
    expected = hf_greedy(folder, PROMPT)
    with llama(ggufs["f32"]) as runtime:
        assert llama_greedy(runtime, tokenizer(PROMPT)["input_ids"]) == expected
    assert len(expected) > MIN_GREEDY and len(set(expected)) > 20  # a long run over many bytes


def test_chat_answers_are_byte_identical_and_end_at_the_end_of_turn(chat):
    folder, ggufs, long_chat, stopping = chat
    _, tokenizer = hf_model(folder)
    long_answer, short_answer = hf_greedy(folder, long_chat), hf_greedy(folder, stopping)
    with llama(ggufs["f32"]) as runtime:
        assert llama_greedy(runtime, chat_ids(tokenizer, long_chat)) == long_answer
        assert llama_greedy(runtime, chat_ids(tokenizer, stopping)) == short_answer
    assert len(long_answer) == GREEDY_BYTES and len(set(long_answer)) > 20
    assert short_answer[-1] == END_OF_TURN and len(short_answer) > MIN_ANSWER


def test_a_folder_without_a_byte_tokenizer_is_refused_and_nothing_is_written(plain, tmp_path):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    folder, _ = plain
    other = tmp_path / "other"
    other.mkdir()
    for name in ["config.json", "model.safetensors"]:
        (other / name).write_bytes((folder / name).read_bytes())
    words = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>").save_pretrained(other)
    with pytest.raises(UserError, match="one token per byte"):
        export_gguf(other, tmp_path / "out.gguf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_a_folder_that_ships_its_tokenizer_code_is_refused(plain, tmp_path):
    """A fused or ``<eot>`` student's tokenizer is a class of its own (``auto_map``): refused by name."""
    folder, _ = plain
    other = tmp_path / "ships-code"
    shutil.copytree(folder, other)
    settings = json.loads((other / "tokenizer_config.json").read_text())
    settings["auto_map"] = {"AutoTokenizer": [None, "tokenizer.StreamTokenizerFast"]}
    (other / "tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(UserError, match="tokenizer_config.json names code the folder ships"):
        export_gguf(other, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()


@pytest.mark.slow
def test_the_command_writes_a_gguf_and_refuses_a_bad_folder_in_one_line(plain, tmp_path):
    folder, _ = plain
    out = tmp_path / "student.gguf"
    done = subprocess.run(
        [sys.executable, "-m", "bytedistill", "export-gguf", str(folder), str(out), "--type", "q8_0"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert out.is_file() and done.stdout.startswith(f"wrote {out} (q8_0, ")
    refused = subprocess.run(
        [sys.executable, "-m", "bytedistill", "export-gguf", str(tmp_path), str(tmp_path / "bad.gguf")],
        check=False,
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2
    assert refused.stderr == f"bytedistill export-gguf: error: {tmp_path} is not a model folder (no config.json)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["student.gguf"]
