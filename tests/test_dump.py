"""``dump`` end to end with a tiny random Llama over the real Llama-3 vocabulary."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from distill.cli import main as cli_main
from distill.windows import plan_windows
from logit_store.store import LogitStore, store_content_hash
from tests.launch import cpu_launch
from tests.teachers import save_tiny_llama3_teacher

DOCUMENTS = {
    "genesis.txt": "In the beginning God created the heaven and the earth.\nAnd the earth was without form.".encode(),
    "invalid.txt": b"bytes \xff\xfe that are not UTF-8 \xc3( and then some",
    "special.txt": "a literal <|begin_of_text|> and <|end_of_text|> in text 🙂".encode(),
    "empty.txt": b"",
    "long.txt": ("The quick brown fox jumps over the lazy dog. " * 30).encode(),
}


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, llama3_tokenizer_path) -> Path:
    return save_tiny_llama3_teacher(tmp_path_factory.mktemp("teacher"), llama3_tokenizer_path)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    for name, data in DOCUMENTS.items():
        (folder / name).write_bytes(data)
    return folder


def dump_args(teacher, corpus, output, *extra) -> list[str]:
    return ["dump", "--teacher", str(teacher), "--corpus", str(corpus), "--output", str(output),
            "--max-length", "64", "--stride", "16", "--batch-tokens", "256", "--progress", "false", *extra]


def teacher_token_nll(model, token_ids: np.ndarray, prefix: int, end_of_text, special, max_length, stride) -> float:
    """−Σ log q over the document's tokens and its end-of-text, computed with the model directly,
    window by window as the dump documents it, q renormalised over regular + end-of-text ids."""
    keep = torch.ones(model.config.vocab_size, dtype=torch.bool)
    keep[list(special)] = False
    keep[list(end_of_text)] = True
    targets = list(token_ids) + [None]
    nll = 0.0
    for w in plan_windows(len(token_ids), 1, max_length, stride):
        ids = torch.tensor([[prefix, *token_ids[w.token_start : w.token_stop]]])
        with torch.no_grad():
            logits = model(ids).logits[0].double()
        logits[:, ~keep] = -torch.inf
        logp = torch.log_softmax(logits, dim=-1)
        for r in range(w.row_start, w.row_stop):
            row = logp[r - w.token_start]
            t = targets[r]
            nll -= float(row[t] if t is not None else torch.logsumexp(row[list(end_of_text)], 0))
    return nll


@pytest.mark.parametrize("encoding, rel", [("float16", 1e-3), ("pow8", 2e-2)])
def test_stream_nll_equals_teacher_token_nll(encoding, rel, teacher_dir, corpus_dir, tmp_path, capsys):
    out = tmp_path / "store"
    assert cli_main(dump_args(teacher_dir, corpus_dir, out, "--encoding", encoding)) == 0
    summary = capsys.readouterr().out
    assert "1 empty skipped" in summary and "teacher BPB" in summary
    store = LogitStore(out)
    assert len(store) == 4
    model = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    vocab = store.vocab
    texts = {}
    for i in range(len(store)):
        doc = store.document(i)
        name = Path(doc.key).name
        texts[name] = doc.layout.text_bytes()
        stream_nll = -float(np.log(doc.target_probabilities().astype(np.float64)).sum())
        expected = teacher_token_nll(model, doc.token_ids, 128_000, vocab.end_of_text_ids, vocab.special_ids, 64, 16)
        assert stream_nll == pytest.approx(expected, rel=rel), name
    assert texts == {k: v for k, v in DOCUMENTS.items() if v}
    assert len(plan_windows(len(store.document(list(texts).index("long.txt")).token_ids), 1, 64, 16)) > 1


@pytest.mark.slow
def test_killed_dump_resumes_to_the_same_store(teacher_dir, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(24):
        (corpus / f"doc{i:02d}.txt").write_bytes(f"Document {i}: ".encode() + b"lorem ipsum dolor sit amet " * (5 + i))
    args = ["--max-length", "64", "--stride", "16", "--batch-tokens", "64", "--group-tokens", "64", "--docs-per-shard", "2", "--progress", "false"]
    command = [sys.executable, "-m", "distill.cli", "dump", "--teacher", str(teacher_dir), "--corpus", str(corpus)]

    whole = tmp_path / "whole"
    subprocess.run(command + ["--output", str(whole)] + args, check=True, capture_output=True)

    killed = tmp_path / "killed"
    proc = subprocess.Popen(command + ["--output", str(killed)] + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(list(killed.glob("shard-*.bds"))) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the dump finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = len(list(killed.glob("shard-*.bds")))
    assert 0 < partial < 12
    result = subprocess.run(command + ["--output", str(killed)] + args, check=True, capture_output=True, text=True)
    assert f"+{2 * partial} already stored" in result.stdout
    assert store_content_hash(killed) == store_content_hash(whole)
    # the resumed run's size figure covers the whole store, not only the documents it added
    stats = LogitStore(killed).stats()
    assert f"({stats['shard_bytes_per_text_byte']:.2f} per text byte)" in result.stdout


@pytest.mark.slow
def test_two_process_accelerate_launch_matches_one_process(teacher_dir, corpus_dir, tmp_path):
    single, double = tmp_path / "single", tmp_path / "double"
    assert cli_main(dump_args(teacher_dir, corpus_dir, single)) == 0
    launch, env = cpu_launch(2)
    proc = subprocess.run(launch + ["-m", "distill.cli"] + dump_args(teacher_dir, corpus_dir, double), env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p.name.split("-")[1] for p in double.glob("shard-*.bds")} == {"00000", "00001"}
    one, two = LogitStore(single), LogitStore(double)
    by_key = {two.document(i).key: two.document(i) for i in range(len(two))}
    assert sorted(by_key) == sorted(one.document(i).key for i in range(len(one)))
    for i in range(len(one)):
        a = one.document(i)
        b = by_key[a.key]
        np.testing.assert_array_equal(a.token_ids, b.token_ids)
        np.testing.assert_allclose(a.values, b.values, atol=2e-2)


def run_cli(args, capsys) -> tuple[int, str]:
    """Exit code and the error line (the last line of stderr; progress bars may precede it)."""
    code = cli_main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    return code, lines[-1] if lines else ""


def test_bad_inputs_fail_in_one_line(teacher_dir, corpus_dir, tmp_path, capsys, llama3_tokenizer_path):
    out = tmp_path / "store"
    cases = {
        "corpus not found": dump_args(teacher_dir, tmp_path / "missing.txt", out),
        "teacher not found": dump_args(tmp_path / "no-teacher", corpus_dir, out),
        "--stride must be": dump_args(teacher_dir, corpus_dir, out, "--stride", "64"),
    }
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    cases["no field 'text'"] = dump_args(teacher_dir, bad_json, out)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine"}\n{not json\n')
    cases["broken.jsonl:2: not valid JSON"] = dump_args(teacher_dir, broken, out)
    for n, (expected, args) in enumerate(cases.items()):
        args[args.index("--output") + 1] = str(tmp_path / f"store{n}")
        code, err = run_cli(args, capsys)
        assert code == 2 and expected in err and err.startswith("bytedistill dump: error: "), (expected, err)


def test_teacher_tokenizer_mismatch_is_refused(tmp_path, corpus_dir, capsys, llama3_tokenizer_path):
    small = save_tiny_llama3_teacher(tmp_path / "small", llama3_tokenizer_path, vocab_size=1000)
    code, err = run_cli(dump_args(small, corpus_dir, tmp_path / "s"), capsys)
    assert code == 2 and "128256 ids" in err and "1000 rows" in err


def test_rerun_with_other_settings_is_refused(teacher_dir, corpus_dir, tmp_path, capsys):
    out = tmp_path / "store"
    assert cli_main(dump_args(teacher_dir, corpus_dir, out, "--max-docs", "1")) == 0
    code, err = run_cli(dump_args(teacher_dir, corpus_dir, out, "--max-docs", "1", "--max-length", "32"), capsys)
    assert code == 2 and "settings" in err and err.startswith("bytedistill dump: error: ")
    # the same command resumes (here: nothing left to do)
    assert cli_main(dump_args(teacher_dir, corpus_dir, out, "--max-docs", "1")) == 0
    out = capsys.readouterr().out
    assert "+1 already stored" in out and "nan" not in out


def test_jsonl_and_parquet_corpora(teacher_dir, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"body": "first document"}, {"body": ""}, {"body": "third 文書"}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    for name in ("c.jsonl", "c.parquet"):
        out = tmp_path / f"store-{name}"
        assert cli_main(dump_args(teacher_dir, tmp_path / name, out, "--text-field", "body")) == 0
        store = LogitStore(out)
        assert [store.document(i).layout.text_bytes() for i in range(len(store))] == [b"first document", "third 文書".encode()]


def test_corpus_fingerprint_follows_content_not_location(corpus_dir, tmp_path, monkeypatch):
    from distill.corpus import CorpusSpec, corpus_fingerprint

    moved = tmp_path / "moved"
    moved.mkdir()
    for file in corpus_dir.iterdir():
        (moved / file.name).write_bytes(file.read_bytes())
    monkeypatch.chdir(tmp_path)
    original = corpus_fingerprint(CorpusSpec(str(corpus_dir)))
    assert corpus_fingerprint(CorpusSpec(str(moved))) == original
    assert corpus_fingerprint(CorpusSpec("moved")) == original  # relative spelling
    assert corpus_fingerprint(CorpusSpec("moved", max_docs=2)) != original
    (moved / "genesis.txt").write_bytes(b"another text")
    assert corpus_fingerprint(CorpusSpec("moved")) != original
