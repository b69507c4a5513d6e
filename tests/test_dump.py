"""``dump`` end to end with a tiny random Llama over the real Llama-3 vocabulary, and over a small
vocabulary where what a test checks does not depend on it."""

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

from bytedistill.cli import main as cli_main
from distill.teacher.windows import plan_windows
from logit_store import LogitStore, store_content_hash
from tests.gguf_teachers import save_small_teacher, write_tiny_gguf
from tests.kill import kill_after_shards, start_bytedistill
from tests.launch import cpu_launch, run_on_two_machines
from tests.teachers import dump_args, save_tiny_llama3_teacher

DOCUMENTS = {
    "genesis.txt": b"In the beginning God created the heaven and the earth.\nAnd the earth was without form.",
    "invalid.txt": b"bytes \xff\xfe that are not UTF-8 \xc3( and then some",
    "special.txt": "a literal <|begin_of_text|> and <|end_of_text|> in text 🙂".encode(),
    "empty.txt": b"",
    "long.txt": ("The quick brown fox jumps over the lazy dog. " * 30).encode(),
}


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory, llama3_tokenizer_path) -> Path:
    return save_tiny_llama3_teacher(tmp_path_factory.mktemp("teacher"), llama3_tokenizer_path)


@pytest.fixture(scope="module")
def small_teacher(tmp_path_factory) -> Path:
    """A tiny random Llama over a 2,000-id byte-level BPE (tests/gguf_teachers.py), for the tests
    whose checks hold for any vocabulary (settings, corpora, refusals, killed, resumed and parallel
    dumps): every dump, in-process or not, would build the Llama-3 tables anew (many seconds)."""
    root = tmp_path_factory.mktemp("small-teacher")
    return save_small_teacher(root / "teacher", write_tiny_gguf(root / "tiny.gguf"))


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    for name, data in DOCUMENTS.items():
        (folder / name).write_bytes(data)
    return folder


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


@pytest.mark.parametrize(
    "encoding, rel, conversion", [("float16", 1e-3, "numba"), ("pow8", 2e-2, "numba"), ("float16", 1e-3, "torch")]
)
def test_stream_nll_equals_teacher_token_nll(encoding, rel, conversion, teacher_dir, corpus_dir, tmp_path, capsys):
    """The brute-force check: every document's ``<eot>`` stream log-likelihood is the teacher's token
    log-likelihood, computed window by window with the model itself; on both conversion paths
    (``torch`` is the CUDA code path, run here on CPU tensors), with row chunks that cut windows.
    (The fused stream's: tests/test_dump_fused.py.)"""
    out = tmp_path / "store"
    args = ["--encoding", encoding, "--conversion", conversion, "--head-rows", "37", "--stream", "eot"]
    assert cli_main(dump_args(teacher_dir, corpus_dir, out, *args)) == 0
    summary = capsys.readouterr().out
    assert "1 empty skipped" in summary and "teacher BPB" in summary
    store = LogitStore(out)
    assert len(store) == 4
    model = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
    vocab = store.vocab
    texts, stored_nll = {}, 0.0
    for i in range(len(store)):
        doc = store.document(i)
        name = Path(doc.key).name
        texts[name] = doc.layout.text_bytes()
        stream_nll = -float(np.log(doc.target_probabilities().astype(np.float64)).sum())
        stored_nll += stream_nll
        expected = teacher_token_nll(model, doc.token_ids, 128_000, vocab.end_of_text_ids, vocab.special_ids, 64, 16)
        assert stream_nll == pytest.approx(expected, rel=rel), name
    assert texts == {k: v for k, v in DOCUMENTS.items() if v}
    printed = float(summary.split("teacher BPB")[1].split()[0])  # of the stored values, as train and score read them
    assert printed == pytest.approx(stored_nll / (np.log(2) * sum(map(len, texts.values()))), abs=5.1e-5)
    assert len(plan_windows(len(store.document(list(texts).index("long.txt")).token_ids), 1, 64, 16)) > 1


# small windows and groups: a dump of lorem_corpus writes many shards, so it can be killed midway
KILLABLE = [
    "--max-length",
    "64",
    "--stride",
    "16",
    "--batch-tokens",
    "64",
    "--group-tokens",
    "64",
    "--progress",
    "false",
]


def lorem_corpus(folder: Path, count: int) -> Path:
    """``count`` text documents of growing length."""
    folder.mkdir()
    for i in range(count):
        (folder / f"doc{i:02d}.txt").write_bytes(f"Document {i}: ".encode() + b"lorem ipsum dolor sit amet " * (5 + i))
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("conversion", ["numba", "torch"])
def test_killed_dump_resumes_to_the_same_store(conversion, small_teacher, tmp_path, capsys, monkeypatch):
    """A dump killed midway (its own process, SIGKILL after 3 of 12 shards) and resumed stores what
    one uninterrupted run stores, and the resumed run passes over the documents already stored
    (the runs before the kill on one torch thread, the resume on the count the store records)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    corpus = lorem_corpus(tmp_path / "corpus", 24)
    args = [*KILLABLE, "--docs-per-shard", "2", "--conversion", conversion]

    def command(output: Path) -> list[str]:
        return ["dump", "--teacher", str(small_teacher), "--corpus", str(corpus), "--output", str(output), *args]

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert cli_main(command(whole)) == 0
    partial = kill_after_shards([start_bytedistill(command(killed))], killed, 3)
    assert 0 < partial < 12
    capsys.readouterr()
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cli_main(command(killed)) == 0
    resumed = capsys.readouterr().out
    assert f"+{2 * partial} already stored" in resumed
    assert store_content_hash(killed) == store_content_hash(whole)
    # the resumed run's size figure covers the whole store, not only the documents it added
    stats = LogitStore(killed).stats()
    assert f"({stats['shard_bytes_per_text_byte']:.2f} per text byte;" in resumed


@pytest.mark.slow
def test_killed_dump_refuses_to_resume_with_other_teacher_weights(small_teacher, tmp_path, capsys):
    """A dump killed midway, the teacher's weights then changed at the same path (same file names
    and sizes): the resume is refused in one line naming both teachers' hashes, and the store is
    left as the killed dump left it (a store never mixes two teachers). The original weights put
    back, the same command resumes."""
    import shutil

    from safetensors.torch import load_file, save_file

    from tests.edges import snapshot

    teacher, corpus, store = tmp_path / "teacher", lorem_corpus(tmp_path / "corpus", 24), tmp_path / "store"
    shutil.copytree(small_teacher, teacher)
    command = ["dump", "--teacher", str(teacher), "--corpus", str(corpus), "--output", str(store), *KILLABLE]
    command += ["--docs-per-shard", "2"]
    partial = kill_after_shards([start_bytedistill(command)], store, 3)
    assert 0 < partial < 12
    original = (teacher / "model.safetensors").read_bytes()
    tensors = load_file(teacher / "model.safetensors")
    name = min(tensors)
    tensors[name] = tensors[name] + 1
    save_file(tensors, teacher / "model.safetensors", {"format": "pt"})
    before = snapshot(store)
    code, err = run_cli(command, capsys)
    assert code == 2 and err.startswith("bytedistill dump: error: ")
    assert "teacher_hash: store has 'sha256:" in err and "this run has 'sha256:" in err, err
    assert snapshot(store) == before
    (teacher / "model.safetensors").write_bytes(original)
    assert cli_main(command) == 0
    assert f"+{2 * partial} already stored" in capsys.readouterr().out


@pytest.mark.slow
def test_two_process_accelerate_launch_matches_one_process(small_teacher, corpus_dir, tmp_path):
    """Two processes on one machine store what one process stores; two machines of one process
    each (``--num_machines 2``, machine ranks 0 and 1) store exactly what the two processes store."""
    single, double, machines = tmp_path / "single", tmp_path / "double", tmp_path / "machines"
    assert cli_main(dump_args(small_teacher, corpus_dir, single)) == 0
    launch, env = cpu_launch(2)
    proc = subprocess.run(
        launch + ["-m", "bytedistill"] + dump_args(small_teacher, corpus_dir, double),
        check=False,
        env=env,
        capture_output=True,
        text=True,
    )
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
    run_on_two_machines(["-m", "bytedistill"] + dump_args(small_teacher, corpus_dir, machines))
    assert {p.name.split("-")[1] for p in machines.glob("shard-*.bds")} == {"00000", "00001"}
    assert store_content_hash(machines) == store_content_hash(double)


def run_cli(args, capsys) -> tuple[int, str]:
    """Exit code and the error line (the last line of stderr; progress bars may precede it)."""
    code = cli_main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    return code, lines[-1] if lines else ""


def test_bad_inputs_fail_in_one_line(small_teacher, corpus_dir, tmp_path, capsys, llama3_tokenizer_path):
    out = tmp_path / "store"
    cases = {
        "corpus not found": dump_args(small_teacher, tmp_path / "missing.txt", out),
        "teacher not found": dump_args(tmp_path / "no-teacher", corpus_dir, out),
        "--stride must be": dump_args(small_teacher, corpus_dir, out, "--stride", "64"),
        "lower --head-rows": dump_args(small_teacher, corpus_dir, out, "--head-rows", "100000000"),
    }
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    cases["no field 'text'"] = dump_args(small_teacher, bad_json, out)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "fine"}\n{not json\n')
    cases["broken.jsonl:2: not valid JSON"] = dump_args(small_teacher, broken, out)
    for n, (expected, args) in enumerate(cases.items()):
        args[args.index("--output") + 1] = str(tmp_path / f"store{n}")
        code, err = run_cli(args, capsys)
        assert code == 2 and expected in err and err.startswith("bytedistill dump: error: "), (expected, err)


def test_teacher_tokenizer_mismatch_is_refused(tmp_path, corpus_dir, capsys, llama3_tokenizer_path):
    small = save_tiny_llama3_teacher(tmp_path / "small", llama3_tokenizer_path, vocab_size=1000)
    code, err = run_cli(dump_args(small, corpus_dir, tmp_path / "s"), capsys)
    assert code == 2 and "128256 ids" in err and "1000 rows" in err


def test_rerun_with_other_settings_is_refused(small_teacher, corpus_dir, tmp_path, capsys):
    out = tmp_path / "store"
    assert cli_main(dump_args(small_teacher, corpus_dir, out, "--max-docs", "1")) == 0
    code, err = run_cli(
        dump_args(small_teacher, corpus_dir, out, "--max-docs", "2", "--max-length", "32", "--encoding", "pow16"),
        capsys,
    )
    assert code == 2 and err.startswith("bytedistill dump: error: ")
    for field in ("settings.max_length: store has 64, this run has 32", "settings.corpus.max_docs", "encoding"):
        assert field in err, (field, err)  # every difference named, however long the line
    # the same command resumes (here: nothing left to do)
    assert cli_main(dump_args(small_teacher, corpus_dir, out, "--max-docs", "1")) == 0
    out = capsys.readouterr().out
    assert "+1 already stored" in out and "nan" not in out


def test_jsonl_and_parquet_corpora(small_teacher, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"body": "first document"}, {"body": ""}, {"body": "third 文書"}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    for name in ("c.jsonl", "c.parquet"):
        out = tmp_path / f"store-{name}"
        assert cli_main(dump_args(small_teacher, tmp_path / name, out, "--text-field", "body")) == 0
        store = LogitStore(out)
        assert [store.document(i).layout.text_bytes() for i in range(len(store))] == [
            b"first document",
            "third 文書".encode(),
        ]


def test_corpus_fingerprint_follows_content_not_location(corpus_dir, tmp_path, monkeypatch):
    from distill.corpus.spec import CorpusSpec, corpus_fingerprint

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


def test_store_names_its_teacher_by_content_not_location(small_teacher, corpus_dir, tmp_path, monkeypatch):
    """The same dump in two folders (teacher, corpus and store side by side in each) writes the
    same bytes in every store file: the manifest names the teacher by its folder name and its
    weights' hash, and where its tokenizer was read relative to the store, never by an absolute path
    (on the same torch thread count, which the manifest records)."""
    import shutil

    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    for where in ("one", "two/deeper"):
        shutil.copytree(small_teacher, tmp_path / where / "teacher")
        shutil.copytree(corpus_dir, tmp_path / where / "corpus")
        args = dump_args(tmp_path / where / "teacher", tmp_path / where / "corpus", tmp_path / where / "store")
        assert cli_main(args) == 0
    files = sorted(p.name for p in (tmp_path / "one" / "store").iterdir() if not p.name.startswith("."))
    assert "manifest.json" in files and "vocab.bin" in files
    for name in files:
        assert (tmp_path / "one/store" / name).read_bytes() == (tmp_path / "two/deeper/store" / name).read_bytes(), name
    manifest = json.loads((tmp_path / "one/store/manifest.json").read_text())
    assert str(tmp_path) not in json.dumps(manifest)
    assert (manifest["teacher"], manifest["tokenizer_source"]) == ("teacher", "../teacher")
    assert manifest["teacher_hash"].startswith("sha256:") and len(manifest["teacher_hash"]) == 7 + 64


def test_utf8_runs_exact_and_linear():
    from bytestream.teacher_tokens import utf8_runs

    def reference(data: bytes) -> list[tuple[bool, bytes]]:  # byte by byte: the longest valid prefix
        runs, pos = [], 0
        while pos < len(data):
            for size in (4, 3, 2, 1):
                try:
                    data[pos : pos + size].decode("utf-8")
                    valid = len(data[pos : pos + size]) == size
                except UnicodeDecodeError:
                    valid = False
                if valid:
                    break
            step = size if valid else 1
            if runs and runs[-1][0] == valid:
                runs[-1] = (valid, runs[-1][1] + data[pos : pos + step])
            else:
                runs.append((valid, data[pos : pos + step]))
            pos += step
        return runs

    rng = np.random.default_rng(0)
    samples = [
        b"",
        "plain ascii and 🙂 text".encode(),
        b"\xff\xfe",
        b"ok \xc3( \xed\xa0\x80 surrogate bytes \xf4\x90\x80\x80",
    ]
    samples += [rng.integers(0, 256, int(n), dtype=np.uint8).tobytes() for n in rng.integers(1, 200, 50)]
    for data in samples:
        assert utf8_runs(data) == reference(data), data
    big = rng.integers(0, 256, 2_000_000, dtype=np.uint8).tobytes()
    start = time.perf_counter()
    runs = utf8_runs(big)
    assert time.perf_counter() - start < 5.0
    assert b"".join(run for _, run in runs) == big


def test_lone_surrogate_in_jsonl_is_one_line(small_teacher, tmp_path, capsys):
    corpus = tmp_path / "s.jsonl"
    corpus.write_text('{"text": "fine"}\n{"text": "a\\ud800b"}\n')
    code, err = run_cli(dump_args(small_teacher, corpus, tmp_path / "out"), capsys)
    assert code == 2 and err.startswith("bytedistill dump: error: ") and "s.jsonl:2" in err and "surrogate" in err, err


def test_split_follows_content_not_path_spelling(small_teacher, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = {f"d{i}.txt": f"document number {i} says {'hello ' * i}".encode() for i in range(8)}
    for name, data in texts.items():
        (corpus / name).write_bytes(data)
    monkeypatch.chdir(tmp_path)
    split = ["--heldout-fraction", "0.5"]
    assert cli_main(dump_args(small_teacher, "corpus", tmp_path / "train", "--subset", "train", *split)) == 0
    assert cli_main(dump_args(small_teacher, corpus.resolve(), tmp_path / "held", "--subset", "heldout", *split)) == 0
    sides = []
    for name in ("train", "held"):
        store = LogitStore(tmp_path / name)
        sides.append({store.document(i).key: store.document(i).layout.text_bytes() for i in range(len(store))})
    train, held = sides
    assert train and held and not set(train) & set(held)
    assert {**train, **held} == texts  # keys are the names inside the corpus, never absolute paths


def test_writer_failure_ends_the_dump_in_one_line(small_teacher, tmp_path):
    """A full disk, simulated by a file-size limit the shard outgrows: exit 2, one line, promptly."""
    import resource

    corpus = tmp_path / "big.txt"
    rng = np.random.default_rng(0)  # text that neither the values nor zstd can squeeze below the limit
    corpus.write_bytes(bytes(rng.choice(list(b"abcdefghij klmnopqrstuvwxyz"), 12_000).astype(np.uint8)))

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (600_000, 600_000))

    command = [sys.executable, "-m", "bytedistill", *dump_args(small_teacher, corpus, tmp_path / "out")]
    proc = subprocess.run(command, preexec_fn=limit_file_size, check=False, capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and last.startswith("bytedistill dump: error: writing the store"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_second_dump_on_the_same_writer_is_refused(small_teacher, corpus_dir, tmp_path, capsys):
    from distill.dump.sharding import WriterLock

    out = tmp_path / "store"
    with WriterLock(out, 0):
        code, err = run_cli(dump_args(small_teacher, corpus_dir, out), capsys)
    assert code == 2 and "another dump is writing writer 0" in err
    assert cli_main(dump_args(small_teacher, corpus_dir, out)) == 0  # released: the dump runs


def _store_documents(directory) -> list[tuple[str, bytes]]:
    store = LogitStore(directory)
    return [(store.document(i).key, store.document(i).layout.text_bytes()) for i in range(len(store))]


@pytest.mark.slow
def test_killed_two_process_dump_resumes_with_one_or_three(small_teacher, tmp_path, capsys, monkeypatch):
    """Documents belong to fixed writers, not to processes: 2 jobs killed mid-run, resumed by 1
    job or by 3 at once, hold every document exactly once — the same store as one uninterrupted run."""
    import shutil

    corpus = lorem_corpus(tmp_path / "corpus", 30)
    args = [*KILLABLE, "--docs-per-shard", "1", "--writers", "6"]

    def command(output, jobs, index):
        return [
            "dump",
            "--teacher",
            str(small_teacher),
            "--corpus",
            str(corpus),
            "--output",
            str(output),
            "--num-shards",
            str(jobs),
            "--shard-index",
            str(index),
            *args,
        ]

    whole, killed, again = tmp_path / "whole", tmp_path / "killed", tmp_path / "again"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the resumes take the count the store records
    assert cli_main(command(whole, 1, 0)) == 0
    partial = kill_after_shards([start_bytedistill(command(killed, 2, k)) for k in range(2)], killed, 6)
    assert 0 < partial < 30
    shutil.copytree(killed, again)
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert cli_main(command(killed, 1, 0)) == 0
    jobs = [start_bytedistill(command(again, 3, k), stderr=subprocess.PIPE) for k in range(3)]  # at once
    for job in jobs:
        assert job.wait(timeout=600) == 0, job.stderr.read()[-2000:]
    expected = _store_documents(whole)
    assert sorted(text for _, text in expected) == sorted((corpus / f"doc{i:02d}.txt").read_bytes() for i in range(30))
    for resumed in (killed, again):
        assert _store_documents(resumed) == expected
        assert store_content_hash(resumed) == store_content_hash(whole)
    capsys.readouterr()
    code, err = run_cli(command(whole, 7, 0), capsys)
    assert code == 2 and "6 writers but 7 workers" in err


def test_a_gguf_teacher_is_parsed_once_per_load_into_the_weights_transformers_loads(tmp_path, monkeypatch):
    """Loading a GGUF teacher reads its metadata in five places (tokenizer, weight check, config
    twice, weights); the file is parsed once per load, and the weights are the ones transformers'
    own load of the file gives."""
    import gguf

    from distill.teacher.model import load_teacher

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    parsed, original = [], gguf.GGUFReader

    def counted(file, mode="r"):
        parsed.append(Path(file).name)
        return original(file, mode)

    monkeypatch.setattr(gguf, "GGUFReader", counted)
    teacher = load_teacher(str(path))
    assert parsed == ["tiny.gguf"] and gguf.GGUFReader is counted  # once, and the reader put back
    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf").state_dict()
    assert len(parsed) > 1  # transformers alone parses it again
    shared = teacher.model.state_dict()
    assert shared.keys() == plain.keys() and all(torch.equal(shared[k], plain[k]) for k in plain)


def test_a_hub_teacher_is_named_by_the_revision_it_loaded(tmp_path):
    """A Hub id's identity is the revision its files were read at (the cache's snapshot), so a
    resume after the id's revision moved is refused; a local teacher's is its files' hash."""
    from distill.teacher.identity import hub_revision, weights_hash

    sha = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--someone--teacher"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(sha)
    (repo / "snapshots" / sha).mkdir(parents=True)
    (repo / "snapshots" / sha / "config.json").write_text("{}")
    assert hub_revision("someone/teacher", cache_dir=str(tmp_path / "hub")) == sha
    assert hub_revision("someone/other", cache_dir=str(tmp_path / "hub")) is None
    assert weights_hash("someone/teacher", revision=sha) == f"hub:{sha}"
    folder = tmp_path / "local"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "README.md").write_text("not weights")
    first = weights_hash(str(folder))
    (folder / "README.md").write_text("still not weights")
    assert weights_hash(str(folder)) == first
    (folder / "model.safetensors").write_bytes(b"other weights")
    assert weights_hash(str(folder)) != first
