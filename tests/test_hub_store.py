"""A store published with ``push-store`` and read back as ``hf://datasets/…``, through the stand-in Hub
of tests/fake_hub.py (on 127.0.0.1) and the real huggingface_hub client: the same training, shards
fetched only when read and never twice, the pinned commit, and every fault in one line."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bytedistill.cli import main
from students.training.checkpoints import latest_checkpoint
from students.training.trainer import train
from tests.fake_hub import FakeHub, serve
from tests.stores import random_texts, write_random_store
from tests.tiny_student import tiny_config

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hf_fake_token"


@pytest.fixture(scope="module")
def stores(tmp_path_factory, llama3_vocab, llama3_converter, llama3_encoder):
    root = tmp_path_factory.mktemp("stores")
    helpers = (llama3_vocab, llama3_converter, llama3_encoder)
    train_store = write_random_store(root / "train", *helpers, random_texts(40, seed=1))
    eval_store = write_random_store(root / "eval", *helpers, random_texts(9, seed=2), seed=9)
    other = write_random_store(root / "other", *helpers, random_texts(12, seed=3), seed=4)
    return train_store, eval_store, other


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The stand-in Hub as huggingface_hub's endpoint, with a Hub cache of this test's own."""
    import huggingface_hub.constants

    cache = tmp_path / "hf" / "hub"
    with serve(FakeHub) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))  # read at import
        yield url


def push(store: Path, repo: str, *flags: str) -> int:
    return main(["push-store", str(store), repo, *flags])


def shards_served() -> list[str]:
    return [name for name, _ in FakeHub.served if name.startswith("shard-")]


def cached_blobs(tmp_path: Path, repo: str) -> list[Path]:
    folder = tmp_path / "hf" / "hub" / f"datasets--{repo.replace('/', '--')}" / "blobs"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err)
    return err[-1]


def _config(out: Path, train_stores, eval_store, **overrides):
    values = {
        "train_stores": [str(s) for s in train_stores],
        "eval_store": str(eval_store),
        "seq_len": 64,
        "batch_size": 4,
        "grad_accum": 2,
        "num_workers": 2,
        "max_steps": 6,
        "eval_every": 3,
        "eval_bytes": 0,
        "checkpoint_every": 3,
        "warmup_steps": 2,
        "lr": 3e-3,
    }
    return tiny_config(out, **{**values, **overrides})


# ---------------------------------------------------------------------------------- publishing


def test_push_store_sends_the_store_files_a_file_list_and_a_card_in_bounded_commits(hub, stores, capsys):
    train_store = stores[0]
    (train_store / "notes.txt").write_text("kept local")
    try:
        assert push(train_store, "me/kjv", "--commit-bytes", "20000") == 0
    finally:
        (train_store / "notes.txt").unlink()
    out = capsys.readouterr()
    assert "notes.txt" in out.err and "hf://datasets/me/kjv@main" in out.out
    *parts, last = FakeHub.commits
    assert len(parts) >= 2 and all(sum(map(len, c["files"].values())) <= 20000 or len(c["files"]) == 1 for c in parts)
    assert set(last["files"]) == {"manifest.json", "hub_files.json", "README.md"}  # the store appears last
    sent = {name for commit in FakeHub.commits for name in commit["files"]}
    assert sent == {p.name for p in train_store.iterdir()} | {"hub_files.json", "README.md"}
    card = last["files"]["README.md"].decode()
    assert "random-llama3" in card and "bytes per text byte" in card and "hf://datasets/me/kjv" in card
    assert set(FakeHub.tokens) == {f"Bearer {TOKEN}"}


def test_push_store_continues_a_push_that_stopped(hub, stores, capsys):
    FakeHub.commits_left = [1]  # the second commit fails
    assert push(stores[0], "me/kjv", "--commit-bytes", "20000", "--retries", "0") == 2
    assert "push-store to" in error_line(capsys) and len(FakeHub.commits) == 1
    first = set(FakeHub.commits[0]["files"])
    FakeHub.commits_left = []
    assert push(stores[0], "me/kjv", "--commit-bytes", "20000") == 0
    resent = {name for commit in FakeHub.commits[1:] for name in commit["files"]}
    assert not first & (resent - {"manifest.json", "hub_files.json", "README.md"})
    assert main(["verify", "hf://datasets/me/kjv"]) == 0


def test_push_store_refuses_a_partial_store_unless_allowed(hub, stores, tmp_path, capsys):
    partial = shutil.copytree(stores[2], tmp_path / "partial")
    (partial / "writer-00000.json").unlink()
    assert push(partial, "me/partial") == 2
    assert "is partial" in error_line(capsys) and FakeHub.requests == []
    assert push(partial, "me/partial", "--allow-partial") == 0


def test_push_store_dry_run_lists_the_files_and_sends_nothing(hub, stores, capsys):
    assert push(stores[2], "me/other", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "manifest.json" in out and "dry run: nothing was uploaded" in out and FakeHub.requests == []


def test_push_store_refuses_a_shard_reached_through_a_link(hub, stores, tmp_path, capsys):
    store = shutil.copytree(stores[2], tmp_path / "linked")
    shard = min(store.glob("shard-*.bds"))
    moved = tmp_path / "elsewhere.bds"
    shard.rename(moved)
    shard.symlink_to(moved)
    assert push(store, "me/linked") == 2
    assert "symbolic link" in error_line(capsys) and FakeHub.requests == []


def test_push_store_to_a_branch_of_a_private_repo_is_read_at_that_branch(hub, stores, capsys):
    assert push(stores[2], "me/branched", "--revision", "v1", "--private") == 0
    created = next(json.loads(body) for path, body in FakeHub.requests if path.startswith("/api/repos/create"))
    assert created["type"] == "dataset" and created["visibility"] == "private"
    assert main(["inspect", "hf://datasets/me/branched@v1"]) == 0
    capsys.readouterr()
    assert main(["inspect", "hf://datasets/me/branched"]) == 2
    assert "holds no hub_files.json" in error_line(capsys)


# ------------------------------------------------------------------------------------ reading


def test_inspect_fetches_no_shard_and_verify_fetches_each_once(hub, stores, capsys):
    assert push(stores[2], "me/other") == 0
    assert main(["inspect", "hf://datasets/me/other"]) == 0
    assert "hf://datasets/me/other" in capsys.readouterr().out and shards_served() == []
    assert main(["verify", "hf://datasets/me/other"]) == 0
    assert main(["verify", "hf://datasets/me/other"]) == 0
    assert sorted(shards_served()) == sorted(p.name for p in stores[2].glob("shard-*.bds"))


def test_training_from_the_hub_gives_the_weights_of_training_from_disk(hub, stores, tmp_path):
    """One process, two data-loader workers: the same losses step for step and the same weights; the
    commit read is pinned in run_info.json; a resumed run reads that commit though main moved on,
    and fetches nothing."""
    train_store, eval_store, other = stores
    assert push(train_store, "me/kjv") == 0 and push(eval_store, "me/kjv-eval") == 0
    local = train(_config(tmp_path / "local", [train_store], eval_store))
    names = (["hf://datasets/me/kjv"], "hf://datasets/me/kjv-eval")
    first = train(_config(tmp_path / "hub", *names, stop_at_step=3))
    pins = json.loads((tmp_path / "hub" / "run_info.json").read_text())["hub_stores"]
    assert set(pins) == {"me/kjv", "me/kjv-eval"} and "@" in pins["me/kjv"]
    fetched = sorted(shards_served())
    assert push(other, "me/kjv") == 0  # main moves on to another store
    second = train(_config(tmp_path / "hub", *names, resume="latest"))
    assert sorted(shards_served()) == fetched  # nothing fetched again
    assert json.loads((tmp_path / "hub" / "run_info.json").read_text())["hub_stores"] == pins
    losses = {**first.losses, **second.losses}
    for step, loss in local.losses.items():
        assert losses[step] == pytest.approx(loss, abs=1e-6), step
    a, b = (load_file(r.checkpoint / "model.safetensors") for r in (local, second))
    assert all(torch.equal(a[k], b[k]) for k in a)


# ------------------------------------------------------------------------------------- faults


def test_a_missing_repo_or_revision_is_one_line(hub, stores, capsys):
    assert main(["verify", "hf://datasets/me/nothing"]) == 2
    assert "no dataset repo me/nothing" in error_line(capsys)
    assert push(stores[2], "me/other") == 0
    assert main(["inspect", "hf://datasets/me/other@no-such-branch"]) == 2
    assert "has no revision 'no-such-branch'" in error_line(capsys)
    assert main(["inspect", "hf://datasets/me"]) == 2
    assert "is named hf://datasets/OWNER/NAME" in error_line(capsys)


def test_a_shard_of_other_bytes_is_removed_from_the_cache_and_fetched_again(hub, stores, tmp_path, capsys):
    assert push(stores[2], "me/other") == 0
    shard = min(p.name for p in stores[2].glob("shard-*.bds"))
    data = (stores[2] / shard).read_bytes()
    FakeHub.corrupt = {shard: data[:100] + bytes([data[100] ^ 1]) + data[101:]}
    assert main(["verify", "hf://datasets/me/other"]) == 2
    assert f"{shard} fetched from" in error_line(capsys)
    repo = tmp_path / "hf" / "hub" / "datasets--me--other"
    assert not list(repo.glob(f"snapshots/*/{shard}"))  # neither its link nor its blob is kept
    assert all(blob.stat().st_size != len(data) for blob in cached_blobs(tmp_path, "me/other"))
    FakeHub.corrupt = {}
    assert main(["verify", "hf://datasets/me/other"]) == 0


def _commit(hub_url: str, repo: str, files: dict[str, bytes]) -> None:
    """Commit ``files`` as they are (a publisher that lies) to a new dataset repo."""
    from huggingface_hub import CommitOperationAdd, HfApi

    api = HfApi(endpoint=hub_url, token=TOKEN)
    api.create_repo(repo, repo_type="dataset", exist_ok=True)
    operations = [CommitOperationAdd(name, data) for name, data in files.items()]
    api.create_commit(repo, operations, repo_type="dataset", commit_message="crafted")


def test_a_lying_manifest_or_file_list_is_one_line(hub, stores, capsys):
    from logit_store.hub_files import describe

    store = stores[2]
    files = {p.name: p.read_bytes() for p in store.iterdir()}
    manifest = json.loads(files["manifest.json"])
    manifest["teacher"] = "another-teacher"  # consistent with its file list, not with its shards
    files["manifest.json"] = json.dumps(manifest).encode()
    entries = {}
    for name, data in files.items():
        path = store.parent / f"crafted-{name}"
        path.write_bytes(data)
        with open(path, "rb") as handle:
            entries[name] = describe(name, handle)
        path.unlink()
    from logit_store.hub_files import FileList

    listed = FileList(entries).to_bytes()
    _commit(hub, "me/lying", {**files, "hub_files.json": listed})
    assert main(["verify", "hf://datasets/me/lying"]) == 2
    assert "written for a different manifest" in error_line(capsys)
    for crafted in ("../../etc/passwd", "shard-00000-00000.bds/../x"):
        doc = json.loads(listed)
        doc["files"][0]["name"] = crafted
        _commit(hub, "me/escape", {"hub_files.json": json.dumps(doc).encode()})
        assert main(["inspect", "hf://datasets/me/escape"]) == 2
        assert "not a store file" in error_line(capsys)
    doc = json.loads(listed)
    doc["files"][0]["size"] = 1 << 62
    _commit(hub, "me/huge", {"hub_files.json": json.dumps(doc).encode()})
    assert main(["inspect", "hf://datasets/me/huge"]) == 2
    assert "corrupt (size" in error_line(capsys)


def test_a_server_that_stops_mid_shard_is_one_line_and_a_rerun_resumes(hub, stores, tmp_path, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DOWNLOAD_TIMEOUT", 0.5)
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 1000)  # the part it keeps, in bytes
    assert push(stores[0], "me/kjv") == 0
    shard = min(p.name for p in stores[0].glob("shard-*.bds"))
    FakeHub.stall = {shard: 3000}
    assert main(["verify", "hf://datasets/me/kjv"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and shard in err and "failed" in err
    repo = tmp_path / "hf" / "hub" / "datasets--me--kjv"
    assert not list(repo.glob(f"snapshots/*/{shard}"))  # nothing a rerun would trust
    FakeHub.stall = {}
    assert main(["verify", "hf://datasets/me/kjv"]) == 0
    assert (shard, 3000) in FakeHub.served  # resumed where the server stopped


@pytest.mark.slow
def test_a_killed_download_resumes_and_a_full_cache_is_one_line(hub, stores, tmp_path):
    """Subprocesses: a verify killed mid-shard leaves nothing a rerun trusts, and the rerun fetches
    only the shards it lacks (huggingface_hub resumes a cut download within a run; a killed one's
    part is its own and is fetched again); a cache on a disk too small (a file-size limit) ends in
    one line; offline, a pinned commit in the cache is read with no request."""
    assert push(stores[0], "me/kjv") == 0
    first, second, *_ = sorted(p.name for p in stores[0].glob("shard-*.bds"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "bytedistill", "verify", "hf://datasets/me/kjv"]
    FakeHub.stall = {second: 40_000}
    proc = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    while (second, 0) not in FakeHub.served and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    repo = tmp_path / "hf" / "hub" / "datasets--me--kjv"
    assert list(repo.glob(f"snapshots/*/{first}")) and not list(repo.glob(f"snapshots/*/{second}"))
    FakeHub.stall = {}
    done = subprocess.run(command, check=False, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert shards_served().count(first) == 1 and shards_served().count(second) == 2

    full_env = {**env, "HF_HOME": str(tmp_path / "small")}

    def small_disk():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    full = subprocess.run(
        command, check=False, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=120, preexec_fn=small_disk
    )
    assert full.returncode == 2 and full.stderr.count("\n") == 1, full.stderr
    assert full.stderr.startswith("bytedistill verify: error: ") and "File too large" in full.stderr
    assert not [p for p in (tmp_path / "small").rglob("snapshots/*/*") if p.stat().st_size >= 200_000]
    again = subprocess.run(command, check=False, env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr

    commit = next((tmp_path / "small").rglob("snapshots/*")).name
    served = len(FakeHub.requests)
    offline = subprocess.run(
        [*command[:-1], f"hf://datasets/me/kjv@{commit}"],
        check=False,
        env={**full_env, "HF_HUB_OFFLINE": "1"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert offline.returncode == 0, offline.stderr
    assert len(FakeHub.requests) == served


@pytest.mark.slow
def test_two_processes_with_two_workers_train_the_same_weights_from_the_hub(hub, stores, tmp_path):
    """``accelerate launch`` with two gloo ranks on the CPU, two data-loader workers each: training
    from the Hub copy gives the weights of the same launch on the store on disk."""
    from configs.fields import flat_values
    from tests.launch import cpu_launch

    train_store, eval_store, _ = stores
    assert push(train_store, "me/kjv") == 0 and push(eval_store, "me/kjv-eval") == 0
    launch, env = cpu_launch(2)

    def run(out: Path, train_stores, held_out) -> dict:
        config = _config(out, train_stores, held_out, max_steps=4, eval_every=2, checkpoint_every=2)
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in flat_values(config).items() if v is not None]
        flags = [f for f in flags if not f.startswith("--train-stores=")]
        command = [*launch, "-m", "bytedistill", "train", "--train-stores", str(train_stores[0]), *flags]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return load_file(latest_checkpoint(out) / "model.safetensors")

    local = run(tmp_path / "local", [train_store], eval_store)
    remote = run(tmp_path / "hub", ["hf://datasets/me/kjv"], "hf://datasets/me/kjv-eval")
    assert local.keys() == remote.keys() and all(torch.equal(local[k], remote[k]) for k in local)
