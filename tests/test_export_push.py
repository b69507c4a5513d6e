"""``push`` against a fake Hub (tests/fake_hub.py: a small http.server on 127.0.0.1 that records
every request); the tests assert on files, commit message and token, and that nothing export did
not write (secrets, dotfiles) leaves the machine.
"""

import json

import pytest

from bytedistill.cli import main as cli_main
from common.errors import UserError
from students.release import exported_folder
from students.release.export import export_student
from students.release.export_record import EXPORT_RECORD
from students.release.push import ENDPOINT_TOKEN, push_folder, resolve_target, upload_plan
from students.training.synthetic import SYNTHETIC_SOURCE
from students.training.trainer import train
from tests.fake_hub import FakeHub, serve
from tests.tiny_student import tiny_config

SECRETS = {".env": "HF_TOKEN=hf_secret", ".git-credentials": "https://me:pw@hf.co", "sub/id_rsa": "PRIVATE KEY"}


@pytest.fixture
def hub():
    with serve(FakeHub) as url:
        yield url


@pytest.fixture(scope="module")
def folder(tmp_path_factory, llama3_tokenizer_path):
    run = tmp_path_factory.mktemp("run")
    train(tiny_config(run, num_layers=1, intermediate_size=32, max_steps=1), SYNTHETIC_SOURCE)
    out = export_student(run, tmp_path_factory.mktemp("hf") / "student", teacher_tokenizer=llama3_tokenizer_path)
    for name, secret in SECRETS.items():  # left in the folder by someone: must never be uploaded
        (out / name).parent.mkdir(exist_ok=True)
        (out / name).write_text(secret)
    return out


def test_push_uploads_exactly_the_planned_files(hub, folder, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token")
    monkeypatch.setenv("HF_ENDPOINT", hub)  # the Hub, as far as huggingface_hub is concerned
    url = push_folder(folder, "me/student", private=True, revision="exp-1", commit_message="first student")
    assert url.endswith("/commit/abc")
    assert set(FakeHub.tokens) == {"Bearer hf_fake_token"}  # token taken from HF_TOKEN
    paths = [p.split("?")[0] for p, _ in FakeHub.requests]
    assert paths[0] == "/api/repos/create" and "/api/models/me/student/branch/exp-1" in paths
    assert json.loads(FakeHub.requests[0][1])["visibility"] == "private"
    (commit,) = FakeHub.commits
    assert commit["path"] == "/api/models/me/student/commit/exp-1" and commit["summary"] == "first student"
    assert sorted(commit["files"]) == [f.path for f in upload_plan(folder)]
    assert commit["files"]["model.safetensors"] == (folder / "model.safetensors").read_bytes()
    uploaded = set(commit["files"])
    assert not uploaded & set(SECRETS) and not any(
        b"secret" in body or b"PRIVATE" in body for _, body in FakeHub.requests
    )
    assert {"tokenization_bytedistill.py", "teacher_tokenizer.json", "README.md", EXPORT_RECORD} <= uploaded


def test_another_endpoint_gets_its_own_token_never_the_hugging_face_one(hub, folder, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_must_stay_here")
    monkeypatch.delenv(ENDPOINT_TOKEN, raising=False)
    assert cli_main(["push", str(folder), "me/student", "--endpoint", hub]) == 2
    assert ENDPOINT_TOKEN in capsys.readouterr().err and FakeHub.requests == []
    monkeypatch.setenv(ENDPOINT_TOKEN, "endpoint_token")
    assert cli_main(["push", str(folder), "me/student", "--endpoint", hub]) == 0
    assert FakeHub.commits and set(FakeHub.tokens) == {"Bearer endpoint_token"}


def test_an_endpoint_from_a_shared_config_file_gets_no_token(hub, folder, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_must_stay_here")
    monkeypatch.delenv(ENDPOINT_TOKEN, raising=False)
    (tmp_path / "push.yaml").write_text(f"endpoint: {hub}\nprivate: true\n")
    assert cli_main(["push", "--config", str(tmp_path / "push.yaml"), str(folder), "me/student"]) == 2
    assert "your Hugging Face token is never sent there" in capsys.readouterr().err and FakeHub.requests == []


def test_dry_run_lists_files_uploads_nothing_and_says_so(hub, folder, capsys, monkeypatch):
    monkeypatch.setenv(ENDPOINT_TOKEN, "endpoint_token")
    devices = []  # of every tensor of every model the dry run builds: meta, none read from the file
    load = exported_folder.load_model

    def recording_load(*args, **kwargs):
        model = load(*args, **kwargs)
        devices.extend({p.device.type for p in model.parameters()})
        return model

    monkeypatch.setattr(exported_folder, "load_model", recording_load)
    assert cli_main(["push", str(folder), "me/student", "--dry-run", "--endpoint", hub]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "Loading weights" not in captured.err  # no progress bar over a load that reads no tensor
    for f in upload_plan(folder):
        assert f"{f.size:,}  {f.path}" in printed
    assert FakeHub.requests == [] and devices == ["meta"]
    assert not any(name in printed for name in SECRETS)
    assert printed.splitlines()[-1].startswith(
        "dry run: nothing was uploaded; push would send these files to me/student@main"
    )


def test_dry_run_warns_about_files_export_did_not_write(hub, folder, capsys, monkeypatch):
    monkeypatch.setenv(ENDPOINT_TOKEN, "endpoint_token")
    assert cli_main(["push", str(folder), "me/student", "--dry-run", "--endpoint", hub]) == 0
    captured = capsys.readouterr()
    assert "warning: not uploading 3 file(s)" in captured.err and all(name in captured.err for name in SECRETS)
    assert not any(name in captured.out for name in SECRETS)


def test_push_refuses_a_folder_export_did_not_write(hub, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(ENDPOINT_TOKEN, "endpoint_token")
    (tmp_path / "config.json").write_text("{}")
    assert cli_main(["push", str(tmp_path), "me/student", "--dry-run", "--endpoint", hub]) == 2
    assert f"has no {EXPORT_RECORD}" in capsys.readouterr().err


def test_dry_run_without_a_token_says_push_would_refuse(hub, folder, capsys, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_must_stay_here")
    monkeypatch.delenv(ENDPOINT_TOKEN, raising=False)
    assert cli_main(["push", str(folder), "me/student", "--dry-run", "--endpoint", hub]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("dry run: nothing was uploaded") and "but push would refuse" in last
    assert ENDPOINT_TOKEN in last and FakeHub.requests == []


def test_the_hub_in_any_spelling_gets_the_hugging_face_token_and_only_it(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv(ENDPOINT_TOKEN, raising=False)
    for url in (None, "https://huggingface.co", "https://HuggingFace.co:443/"):
        assert resolve_target(url).token == "hf_x"
    for lookalike in ("https://huggingface.co.evil.example", "https://huggingface.co:8443", "http://huggingface.co"):
        with pytest.raises(UserError, match="never sent there"):
            resolve_target(lookalike)


def test_a_fused_folder_pushes_exactly_its_planned_files(hub, tmp_path, llama3_tokenizer_path, monkeypatch):
    """A fused student's folder (no plain byte tokenizer, ``byte_stream: "fused"`` in its configs)
    passes push's load check and uploads what export wrote."""
    run = tmp_path / "run"
    train(tiny_config(run, num_layers=1, intermediate_size=32, max_steps=1, stream="fused"), SYNTHETIC_SOURCE)
    out = export_student(run, tmp_path / "fused", teacher_tokenizer=llama3_tokenizer_path)
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token")
    monkeypatch.setenv("HF_ENDPOINT", hub)
    push_folder(out, "me/fused-student", private=True, revision="main", commit_message="fused")
    (commit,) = FakeHub.commits
    uploaded = commit["files"]
    assert sorted(uploaded) == [f.path for f in upload_plan(out)]
    assert "tokenizer.json" not in uploaded  # a fused folder ships no plain byte tokenizer
    assert json.loads(uploaded["config.json"])["byte_stream"] == "fused"
    assert json.loads(uploaded["tokenizer_config.json"])["byte_stream"] == "fused"
