"""Fused-stream students in a user's hands: the stream tokenizer writes the dump's fused stream
(Llama-3 and a SentencePiece family), ``decode`` drops the flags, a prompt's last word is fed with
the student choosing each byte's flag, and batches of prompts generate what each does alone."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from bytedistill.cli import main as cli_main
from bytestream.alphabet import FUSED_BOS, FUSED_ENDS, FUSED_EOS, FUSED_PAD, NUM_BYTES
from bytestream.stream_kind import StreamKind
from bytestream.stream_tokenizer import ByteStreamTokenizer, TeacherTokens
from bytestream.trie import build_trie
from distill.teacher.encode import DocumentEncoder, with_specials_marked
from logit_store import LogitStore
from students.release.export import export_student
from students.release.generate import GenerateOptions, generate_batch, generate_bytes, load_folder
from students.release.score import ScoreOptions, documents, score, score_documents
from students.training.trainer import train
from tests.conftest import SAMPLE_DOCUMENTS
from tests.stores import random_texts, write_random_store
from tests.teachers import dump_args, mistral_sentencepiece_folder, phi3_style, save_tiny_llama3_teacher
from tests.test_generation import check_call_forms, check_padded_batch_heals_each_row
from tests.tiny_student import tiny_config

FUSED = StreamKind.FUSED
PROMPTS = ["In the beginning God creat", "And", "x = f(a1, b"]  # three lengths, each cut inside a word
GREEDY = {"max_new_tokens": 20, "do_sample": False}
QUIET = ScoreOptions(progress=False)


def fused_flat_model(seed: int = 0) -> LlamaForCausalLM:
    """A fused flat student as ``train --stream fused`` builds it: a stock Llama over 515 symbols."""
    config = LlamaConfig(
        vocab_size=FUSED.alphabet_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=64,
        max_position_embeddings=96,
        bos_token_id=FUSED.bos,
        eos_token_id=FUSED.eos,
        pad_token_id=FUSED.pad,
        tie_word_embeddings=False,
        byte_stream=FUSED.value,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.pad_token_id = FUSED.pad
    return model


@pytest.fixture(scope="module")
def fused_tokenizer(llama3_tokenizer_path):
    return ByteStreamTokenizer(teacher_tokenizer_file=llama3_tokenizer_path, byte_stream="fused")


@pytest.fixture(scope="module")
def llama3_trie(llama3_converter):
    return llama3_converter.trie


# ------------------------------------------------------------------ the stream


@pytest.mark.parametrize("name", sorted(SAMPLE_DOCUMENTS))
def test_the_tokenizer_writes_the_dumps_fused_stream_on_llama3(name, fused_tokenizer, llama3_encoder, llama3_trie):
    data = SAMPLE_DOCUMENTS[name]
    layout = FUSED.layout(llama3_trie, llama3_encoder.encode(data))
    assert fused_tokenizer.encode_bytes(data, eos=True) == layout.symbols.tolist()
    if data.decode("utf-8", errors="ignore").encode() == data:  # valid UTF-8: the call gives it too
        assert fused_tokenizer(data.decode()).input_ids == layout.symbols.tolist()[:-1]


def test_a_token_that_is_a_prefix_of_another_ends_where_the_teacher_ends_it(fused_tokenizer):
    """`` the`` is a token and a prefix of `` there``: each is flagged at its own last byte."""
    assert fused_tokenizer.teacher.streamed_tokens(b" the there") == [b" the", b" there"]
    ids = fused_tokenizer.encode_bytes(b" the there", bos=False)
    assert ids == [*b" th", FUSED_ENDS + ord("e"), *b" ther", FUSED_ENDS + ord("e")]
    word = "é東".encode()  # multi-byte UTF-8: one symbol per byte, only the token's last byte flagged
    symbols = fused_tokenizer.encode_bytes(word, bos=False)
    assert len(symbols) == len(word) and FUSED.text_bytes(symbols) == word
    assert sum(FUSED.closes_token(s) for s in symbols) == len(fused_tokenizer.teacher.streamed_tokens(word))


@pytest.fixture(scope="module")
def sentencepiece(tmp_path_factory):
    """Phi-3's layout of a real Mistral v1 SentencePiece model: its dump encoder, trie and fused tokenizer."""
    folder = mistral_sentencepiece_folder(tmp_path_factory.mktemp("sp") / "v1", "v1")
    from bytestream.vocab import vocab_from_tokenizer

    tok = phi3_style(folder)
    vocab = vocab_from_tokenizer(tok)
    path = folder / "marked_tokenizer.json"
    path.write_text(json.dumps(with_specials_marked(json.loads(tok.backend_tokenizer.to_str()), vocab)))
    tokenizer = ByteStreamTokenizer(teacher_tokenizer_file=str(path), byte_stream="fused")
    return DocumentEncoder(tok, vocab), build_trie(vocab), tokenizer


@pytest.mark.parametrize("data", [b"In the beginning", b" a leading space", b" ", "Grüße 🙂 東京".encode(), b"ok \xff"])
def test_the_tokenizer_writes_the_dumps_fused_stream_on_sentencepiece(data, sentencepiece):
    """The dummy prefix space is context; a document that opens with the space alone starts at the root."""
    encoder, trie, tokenizer = sentencepiece
    assert isinstance(tokenizer.teacher, TeacherTokens) and tokenizer.teacher.dummy_prefix
    assert tokenizer.encode_bytes(data, eos=True) == FUSED.layout(trie, encoder.encode(data)).symbols.tolist()


def test_decode_drops_the_flags(fused_tokenizer):
    text = "In the beginning héllo 東京 <|begin_of_text|>"
    ids = fused_tokenizer(text).input_ids
    assert ids[0] == FUSED_BOS and any(FUSED_ENDS <= s < 2 * NUM_BYTES for s in ids)
    assert fused_tokenizer.decode(ids, skip_special_tokens=True) == text
    unflagged = [s % NUM_BYTES if s < 2 * NUM_BYTES else s for s in ids]  # both symbols of a byte: that byte
    assert fused_tokenizer.decode(unflagged, skip_special_tokens=True) == text
    half = list("世".encode())[:2]
    flagged_half = [half[0], FUSED_ENDS + half[1]]
    assert fused_tokenizer.decode(flagged_half) == "\ufffd"  # invalid UTF-8 as text: U+FFFD
    assert fused_tokenizer.text_bytes([FUSED_BOS, *flagged_half, FUSED_EOS]) == "世".encode()[:2]  # exact bytes
    assert (fused_tokenizer.bos_token_id, fused_tokenizer.eos_token_id, fused_tokenizer.pad_token_id) == (
        FUSED_BOS,
        FUSED_EOS,
        FUSED_PAD,
    )
    assert len(fused_tokenizer) == FUSED.alphabet_size and "<eot>" not in fused_tokenizer.get_vocab()


def test_a_prompt_commits_the_teachers_flags_up_to_its_last_word(fused_tokenizer):
    symbols, open_bytes = fused_tokenizer.encode_prompt(b"In the begi")
    assert open_bytes == b" begi"  # the teacher would end " beg" "i": the student decides instead
    assert symbols == [FUSED_BOS, ord("I"), FUSED_ENDS + ord("n"), *b" th", FUSED_ENDS + ord("e")]
    assert fused_tokenizer("In the begi").input_ids[-2:] == [ord("g") + FUSED_ENDS, ord("i") + FUSED_ENDS]


# ------------------------------------------------------------------ healing: the student's flags


def test_the_last_prompt_bytes_flag_is_the_students_choice(fused_tokenizer):
    """Each fed byte keeps only its two symbols, and the student's scores pick one: here the
    student is made to prefer "goes on" at the last byte, where the teacher's tokenizer of the
    prompt ends a token, and the output follows the student."""
    prompt = "In the begi"
    model = fused_flat_model()
    inputs = fused_tokenizer.prompt(prompt)
    start = inputs["input_ids"].shape[1]
    open_bytes = fused_tokenizer.encode_prompt(prompt.encode())[1]
    output = model.generate(**inputs, **GREEDY)[0].tolist()
    last = start + len(open_bytes) - 1  # one step per fed byte, no extra symbol
    with torch.no_grad():
        hidden = model(input_ids=torch.tensor([output[:last]]), output_hidden_states=True).hidden_states[-1][0, -1]
        byte = open_bytes[-1]
        model.lm_head.weight[FUSED_ENDS + byte] = model.lm_head.weight[byte] - 4.0 * hidden / hidden.dot(hidden)
    output = model.generate(**fused_tokenizer.prompt(prompt), **GREEDY)[0].tolist()
    for at in range(start, start + len(open_bytes)):
        byte = open_bytes[at - start]
        logits = model(input_ids=torch.tensor([output[:at]])).logits[0, -1]
        assert output[at] == max([byte, FUSED_ENDS + byte], key=lambda s: logits[s].item()), at
    assert output[last] == open_bytes[-1] != fused_tokenizer(prompt).input_ids[-1]  # goes on: the student's flag
    assert FUSED.text_bytes(output[start : start + len(open_bytes)]) == open_bytes
    assert fused_tokenizer.decode(output, skip_special_tokens=True).startswith(prompt)


def continuation(output: torch.Tensor, width: int) -> list[int]:
    return [s for s in output[width:].tolist() if s != FUSED_PAD]


def test_a_padded_batch_generates_what_each_prompt_generates_alone(fused_tokenizer):
    model = fused_flat_model()
    common = {**GREEDY, "suppress_tokens": [FUSED_BOS, FUSED_PAD]}
    batch = fused_tokenizer.prompt(PROMPTS, padding=True)
    width = batch["input_ids"].shape[1]
    assert len({int(m.sum()) for m in batch["attention_mask"]}) == 3 and batch["input_ids"][1, 0] == FUSED_PAD
    for options in ({}, {"use_cache": False}):
        output = model.generate(**fused_tokenizer.prompt(PROMPTS, padding=True), **common, **options)
        for row, prompt in enumerate(PROMPTS):
            alone = fused_tokenizer.prompt(prompt)
            single = model.generate(**alone, **common, **options)[0]
            assert continuation(output[row], width) == continuation(single, alone["input_ids"].shape[1]), prompt


def test_batched_byte_generation_counts_text_bytes_and_equals_each_prompt_alone(fused_tokenizer):
    """``bytedistill generate``'s batches: the budget counts text bytes (every fused symbol below
    512), past the trained context the window slides per row."""
    model = fused_flat_model()
    model.generation_config.suppress_tokens = [FUSED_BOS, FUSED_EOS, FUSED_PAD]
    options = GenerateOptions(max_new_bytes=110, greedy=True)  # past the 96 symbols of context
    together = generate_batch(model, fused_tokenizer, PROMPTS, options)
    assert together == [generate_bytes(model, fused_tokenizer, p, options) for p in PROMPTS]
    assert all(len(c) == 110 for c in together)


def test_a_tokenizer_of_the_other_stream_is_refused(llama3_tokenizer_path):
    from common.errors import UserError

    eot_tokenizer = ByteStreamTokenizer(teacher_tokenizer_file=llama3_tokenizer_path)
    with pytest.raises(UserError, match="reads the fused stream but its stream tokenizer writes the <eot> stream"):
        generate_batch(fused_flat_model(), eot_tokenizer, ["In"], GenerateOptions(max_new_bytes=2))


# ------------------------------------------------------------------ the exported folder


ARCHITECTURES = {"flat": {}, "patched": {"architecture": "patched", "local_hidden_size": 16, "local_window": 6}}
RUN = {"warmup_steps": 1, "lr": 3e-3, "seq_len": 48, "batch_size": 2, "max_steps": 3, "eval_bytes": 0}


@dataclass
class Trained:
    architecture: str
    folder: Path
    eval_store: Path
    last_eval: dict


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def trained(request, tmp_path_factory, llama3_vocab, llama3_converter, llama3_encoder, llama3_tokenizer_path):
    """A fused student of each architecture, trained a few steps on fused stores and exported."""
    root = tmp_path_factory.mktemp(f"fused-{request.param}")
    helpers = (llama3_vocab, llama3_converter, llama3_encoder)
    train_store = write_random_store(root / "train", *helpers, random_texts(10, seed=1), stream=FUSED)
    eval_store = write_random_store(root / "eval", *helpers, random_texts(4, seed=2), seed=9, stream=FUSED)
    values = {"train_stores": [str(train_store)], "eval_store": str(eval_store), "stream": "fused", **RUN}
    config = tiny_config(root / "run", **values, **ARCHITECTURES[request.param], checkpoint_every=RUN["max_steps"])
    result = train(config)
    folder = export_student(root / "run", root / "model", teacher_tokenizer=llama3_tokenizer_path)
    return Trained(request.param, folder, eval_store, result.last_eval)


@pytest.fixture(scope="module")
def fused_folder(trained):
    return trained.folder


def load_as_the_card_says(trained: Trained):
    """The model as the card's usage loads it: flat with no remote code, patched with the folder's code."""
    remote = trained.architecture == "patched"
    return AutoModelForCausalLM.from_pretrained(trained.folder, trust_remote_code=remote).eval()


def test_the_folder_loads_as_its_card_says(trained):
    """Flat: a stock Llama with no remote code; the stream tokenizer with it; config ids of the fused stream."""
    folder = trained.folder
    card = (folder / "README.md").read_text()
    assert "515-symbol vocabulary" in card and "fused stream" in card and "token-end flags" in card
    loading = {
        "flat": "from_pretrained(repo)  # a stock Llama: no remote code",
        "patched": "from_pretrained(repo, trust_remote_code=True)  # the patched student",
    }
    assert loading[trained.architecture] in card
    model = load_as_the_card_says(trained)
    if trained.architecture == "flat":
        assert type(model) is LlamaForCausalLM
    else:
        assert type(model).__name__ == "PatchedStudent"  # the folder's class (or the library's, once registered)
    assert StreamKind.of_config(model.config) is FUSED and model.config.vocab_size == FUSED.alphabet_size
    assert (model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id) == (512, 513, 514)
    generation = model.generation_config
    assert (generation.eos_token_id, generation.pad_token_id, generation.suppress_tokens) == (513, 514, [512, 514])
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert tokenizer.byte_stream == "fused" and tokenizer("In").input_ids == [
        FUSED_BOS,
        ord("I"),
        FUSED_ENDS + ord("n"),
    ]
    with pytest.raises(ValueError, match=r"trust_remote_code=True"):
        AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    assert not (folder / "tokenizer.json").exists()  # no plain byte tokenizer: it would flag no token end
    stock, library_tokenizer = load_folder(folder)
    assert library_tokenizer.byte_stream == "fused" and StreamKind.of_config(stock.config) is FUSED


def test_export_then_score_equals_trains_evaluation(trained):
    """``score`` of the held-out store, through the library and through the card's loading path."""
    last = trained.last_eval
    ours = score(trained.folder, [trained.eval_store], QUIET)[-1]
    assert ours.bytes == last["eval_bytes"] == LogitStore(trained.eval_store).stats()["text_bytes"]
    assert ours.student_bpb == pytest.approx(last["student_bpb"], abs=1e-4)
    sources = [trained.eval_store]
    docs = list(documents(sources, None, QUIET, FUSED))
    carded = score_documents(load_as_the_card_says(trained), sources, docs, QUIET)[-1]
    assert carded.bytes == ours.bytes and carded.student_bpb == pytest.approx(last["student_bpb"], abs=1e-4)


def test_a_padded_batch_of_prompts_generates_what_each_generates_alone(trained):
    model, tokenizer = load_folder(trained.folder)
    common = {**GREEDY, "suppress_tokens": [FUSED_BOS, FUSED_PAD]}
    batch = tokenizer.prompt(PROMPTS, padding=True)
    width = batch["input_ids"].shape[1]
    output = model.generate(**batch, **common)
    for row, prompt in enumerate(PROMPTS):
        alone = tokenizer.prompt(prompt)
        single = model.generate(**alone, **common)[0]
        assert continuation(output[row], width) == continuation(single, alone["input_ids"].shape[1]), prompt
    options = GenerateOptions(max_new_bytes=60, greedy=True)  # past the 48 symbols of context
    model.generation_config.suppress_tokens = [FUSED_BOS, FUSED_EOS, FUSED_PAD]
    together = generate_batch(model, tokenizer, PROMPTS, options)
    assert together == [generate_bytes(model, tokenizer, p, options) for p in PROMPTS]
    assert all(len(c) == 60 for c in together)


def test_every_call_form_gives_the_same_symbols(fused_folder):
    tokenizer = AutoTokenizer.from_pretrained(fused_folder, trust_remote_code=True)
    stock_generation = json.loads((fused_folder / "generation_config.json").read_text())
    assert stock_generation["eos_token_id"] == FUSED_EOS
    remote = AutoModelForCausalLM.from_pretrained(fused_folder, trust_remote_code=True).eval()
    stock, _ = load_folder(fused_folder)
    for sampling in ({"do_sample": False}, {"do_sample": True, "top_k": 20, "temperature": 0.8}):
        check_call_forms(tokenizer, remote, stock, sampling)


def test_a_padded_batch_of_complete_streams_heals_each_row_as_alone(fused_folder):
    check_padded_batch_heals_each_row(fused_folder, FUSED_PAD)


def test_the_remote_generate_heals_rows_cut_on_the_left(fused_folder):
    tokenizer = load_folder(fused_folder)[1]
    data = b"And God said, Let there be light: and there was li"
    row = tokenizer.encode_bytes(data)
    committed, open_bytes = tokenizer.encode_prompt(data)
    assert tokenizer._split_stream(row) == (committed, open_bytes) and open_bytes == b" li"
    first_end = next(i for i, s in enumerate(row) if FUSED.closes_token(s))
    cut = row[2:]  # starts inside the first token: healed from the first token end on
    assert tokenizer._split_stream(cut) == (cut[: len(committed) - 2], b" li") and first_end < len(committed)
    plain = [FUSED_BOS, *data]  # no token end flagged: not this tokenizer's stream, passed unchanged
    assert tokenizer._split_stream(plain) == (plain, b"")


# ------------------------------------------------------------------ score


@pytest.fixture(scope="module")
def fused_stores(tmp_path_factory, llama3_tokenizer_path):
    """A tiny random Llama-3 teacher's fused and ``<eot>`` stores of a few texts (invalid UTF-8 included)."""
    root = tmp_path_factory.mktemp("fused-stores")
    teacher = save_tiny_llama3_teacher(root / "teacher", llama3_tokenizer_path)
    corpus = root / "corpus"
    corpus.mkdir()
    for i, data in enumerate(SCORED):
        (corpus / f"doc{i}.txt").write_bytes(data)
    for stream in ("fused", "eot"):
        assert cli_main(dump_args(teacher, corpus, root / stream, "--stream", stream)) == 0
    return root / "fused", root / "eot"


SCORED = [
    b"In the beginning God created the heaven and the earth. " * 3,
    "Grüße aus Köln 🙂 — 東京".encode(),
    b"bytes \xff\xfe that are not UTF-8 \xc3( end",
]


def test_score_of_a_fused_store_equals_the_score_of_its_text(fused_folder, fused_stores, tmp_path):
    """The store's streams are the stream tokenizer's; the BPB denominator is the text bytes."""
    store = LogitStore(fused_stores[0])
    texts = []
    for i in range(len(store)):
        texts.append(tmp_path / f"{i}.txt")
        texts[-1].write_bytes(store.document(i).layout.text_bytes())
    # a text file is a source of one document, windowed from its own start: the store's documents
    # each scored from their own <bos> (packed=False) are the same windows
    each = ScoreOptions(progress=False, packed=False)
    of_store, of_texts = score(fused_folder, [fused_stores[0]], each)[-1], score(fused_folder, texts, QUIET)[-1]
    assert of_store.bytes == of_texts.bytes == sum(map(len, SCORED)) and of_store.documents == len(SCORED)
    assert of_store.student_bpb == pytest.approx(of_texts.student_bpb, rel=1e-9)
    assert of_store.teacher_bpb is not None and of_texts.teacher_bpb is None
    alone = score(fused_folder, texts, each)[-1]
    assert alone.bytes == of_texts.bytes and alone.student_bpb == pytest.approx(of_texts.student_bpb, rel=1e-9)
    packed = score(fused_folder, [fused_stores[0]], QUIET)[-1]
    assert packed.bytes == of_store.bytes and math.isfinite(packed.student_bpb)


def test_plain_scores_of_a_fused_student_are_its_unflagged_bytes(fused_folder, tmp_path):
    """``--mode plain`` feeds ``<bos>`` + bytes + ``<eos>`` with no byte flagged; its NLL is the
    model's own on those symbols (recomputed here), and ``plain-renormalised`` (the 256 unflagged
    bytes and ``<eos>`` only) scores the same bytes higher."""
    text = SCORED[1]
    (tmp_path / "one.txt").write_bytes(text)
    options = {"progress": False, "packed": False}
    plain = score(fused_folder, [tmp_path / "one.txt"], ScoreOptions(mode="plain", **options))[-1]
    renormalised = score(fused_folder, [tmp_path / "one.txt"], ScoreOptions(mode="plain-renormalised", **options))[-1]
    model, _ = load_folder(fused_folder)
    ids = torch.tensor([[FUSED_BOS, *text, FUSED_EOS]])
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[0, :-1]
    by_hand = -logprobs.gather(-1, ids[0, 1:].unsqueeze(-1)).sum().item()
    assert plain.bytes == renormalised.bytes == len(text)
    assert plain.student_nll == pytest.approx(by_hand, rel=1e-5)
    assert renormalised.student_nll < plain.student_nll


def test_a_store_of_the_other_stream_is_refused_in_one_line(fused_folder, fused_stores, capsys):
    assert cli_main(["score", str(fused_folder), str(fused_stores[1]), "--progress", "false"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"bytedistill score: error: {fused_stores[1]} is a <eot>-stream store and the student reads the fused "
        "stream: score a store dumped with --stream fused, or the text"
    )


# ------------------------------------------------------------------ lm-evaluation-harness


def lm_eval_task(tmp_path: Path, name: str, records: list[dict], body: str) -> None:
    (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in records))
    (tmp_path / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {tmp_path / f'{name}.jsonl'}\ntest_split: test\n{body}"
    )


def lm_eval_run(folder: Path, tmp_path: Path, task: str, batch_size: int) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    return lm_eval.simple_evaluate(
        model="hf",
        model_args=f"pretrained={folder},trust_remote_code=True",
        tasks=[task],
        task_manager=TaskManager(include_path=str(tmp_path), include_defaults=False),  # not lm-eval's own task files
        batch_size=batch_size,
        device="cpu",
        log_samples=True,
    )


@pytest.mark.slow
def test_lm_eval_rolling_loglikelihood_and_generate_until(trained, tmp_path, monkeypatch):
    """Rolling log-likelihood's bits per byte is ``score --packed false``'s; ``generate_until`` gives
    the continuation ``tokenizer.prompt`` + the stock ``generate`` give (healed prompts)."""
    pytest.importorskip("lm_eval")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    docs = ["And the evening and the morning were the first day. " * 4, "Grüße aus Köln 🙂 — 東京. " * 3]
    lm_eval_task(
        tmp_path,
        "fused_rolling",
        [{"text": d} for d in docs],
        'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\n'
        "metric_list:\n  - metric: bits_per_byte\n    aggregation: bits_per_byte\n    higher_is_better: false\n",
    )
    harness = lm_eval_run(trained.folder, tmp_path, "fused_rolling", 4)["results"]["fused_rolling"][
        "bits_per_byte,none"
    ]
    ours = score(trained.folder, [tmp_path / "fused_rolling.jsonl"], ScoreOptions(packed=False, progress=False))[-1]
    assert harness == pytest.approx(ours.student_bpb, rel=0.01)

    model, tokenizer = load_folder(trained.folder)
    prompts = ["In the begi", "And the morn", "x = f(a1"]

    def healed(prompt: str) -> bytes:
        inputs = tokenizer.prompt(prompt)
        output = model.generate(**inputs, max_new_tokens=24, do_sample=False)[0]
        fed = len(tokenizer.encode_prompt(prompt.encode())[1])
        return tokenizer.text_bytes(output[inputs["input_ids"].shape[1] :])[fed:]

    expected = [healed(p) for p in prompts]
    lm_eval_task(
        tmp_path,
        "fused_cuts",
        [{"context": p, "target": "x"} for p in prompts],
        'output_type: generate_until\ndoc_to_text: "{{context}}"\ndoc_to_target: "{{target}}"\n'
        "generation_kwargs:\n  until: ['\\u0000']\n  do_sample: false\n  max_gen_toks: 8\n"
        "metric_list:\n  - metric: exact_match\n    aggregation: mean\n    higher_is_better: true\n",
    )
    samples = sorted(
        lm_eval_run(trained.folder, tmp_path, "fused_cuts", 2)["samples"]["fused_cuts"], key=lambda s: s["doc_id"]
    )
    for sample, want in zip(samples, expected, strict=True):
        text = sample["resps"][0][0]
        assert text and want.decode("utf-8", errors="replace").startswith(text.rstrip("\ufffd")), sample["doc"]
