"""Export a trained student as a Hugging Face model folder.

The folder holds ``config.json`` + ``model.safetensors`` (a stock Llama whose
``max_position_embeddings`` is the trained context), ``generation_config.json`` (``<eos>`` stops
generation; ``<bos>``/``<pad>`` never generated), two tokenizers and a model card ``README.md``:

- the stream tokenizer (``AutoTokenizer.from_pretrained(folder, trust_remote_code=True)``):
  ``tokenization_bytedistill.py`` (a copy of :mod:`bytestream.stream_tokenizer`) and the teacher's
  ``teacher_tokenizer.json``; it gives the student the training stream with the teacher's
  ``<eot>`` marks;
- the plain byte tokenizer (``tokenizer.json``; ``PreTrainedTokenizerFast``, no remote code): bytes
  without ``<eot>`` marks, which the student never saw in training (worse BPB, stated in the card);
- ``custom_generate/generate.py`` (a copy of :mod:`students.custom_generate`): with
  ``trust_remote_code=True`` on the model too, ``model.generate`` heals prompts given as complete
  streams (lm-evaluation-harness's generation tasks).

``bytedistill_export.json`` records every file export wrote (:mod:`students.export_record`); ``push``
uploads only those, and a new export into the folder replaces them. A folder holding anything else
(dotfiles aside), or whose record names anything but regular files inside it, is refused before a
file is touched. The new export is written beside the old one and swapped in only when complete,
one export into a folder at a time (:mod:`students.export_staging`): a failure leaves the old one whole.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from bytestream import stream_tokenizer
from bytestream.alphabet import BOS, EOS, PAD
from bytestream.errors import UserError
from bytestream.stream_tokenizer import TEACHER_TOKENIZER_FILE, TeacherTokens
from bytestream.vocab import TeacherVocab
from students import architectures, custom_generate
from students.checkpoints import TRAINER_STATE, latest_checkpoint, read_json, require_complete
from students.export_record import EXPORT_RECORD, foreign_entries, recorded_files, visible_entries, write_record
from students.export_staging import clean_leftover, export_lock, staging, swap_in
from students.tokenizer import build_tokenizer

REMOTE_CODE_FILE = "tokenization_bytedistill.py"
CUSTOM_GENERATE_FILE = "custom_generate/generate.py"  # transformers binds it as model.generate (trust_remote_code)


@dataclass(frozen=True)
class ChosenCheckpoint:
    path: Path
    step: int
    unfinished: list[Path]  # newer checkpoints passed over: they have no trainer_state.json (a run stopped mid-save)


def choose_checkpoint(path: Path) -> ChosenCheckpoint:
    """A checkpoint directory itself, or the newest finished checkpoint of a training output directory."""
    path = Path(path)
    if (path / TRAINER_STATE).is_file():
        return ChosenCheckpoint(path, require_complete(path).step, [])
    started = sorted(p for p in (path / "checkpoints").glob("step-*") if p.is_dir()) if path.is_dir() else []
    found = latest_checkpoint(path) if path.is_dir() else None
    unfinished = [p for p in started if not (p / TRAINER_STATE).is_file() and (found is None or p.name > found.name)]
    if found is not None:
        return ChosenCheckpoint(found, require_complete(found).step, unfinished)
    if unfinished:
        raise UserError(f"{path} has no finished checkpoint ({unfinished[-1].name} has no {TRAINER_STATE})")
    raise UserError(f"{path} is neither a training checkpoint nor an output directory with checkpoints")


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory itself, or the newest finished checkpoint of a training output directory."""
    return choose_checkpoint(path).path


def load_student(checkpoint: Path) -> LlamaForCausalLM:
    """The student saved in a trainer checkpoint (config.json + model.safetensors), in eval mode."""
    config_file, weights_file = checkpoint / "config.json", checkpoint / "model.safetensors"
    for needed in (config_file, weights_file):
        if not needed.is_file():
            raise UserError(f"checkpoint {checkpoint} lacks {needed.name}")
    if architectures.architecture_of(config_file) == "patched":
        return architectures.load_patched(checkpoint)
    model = LlamaForCausalLM(LlamaConfig.from_dict(read_json(config_file)))
    tied = frozenset({"lm_head.weight"} if model.config.tie_word_embeddings else ())
    architectures.load_weights(model, weights_file, "flat", tied)
    model.tie_weights()
    return model.eval()


def generation_config() -> GenerationConfig:
    """Stop at ``<eos>``. No length of its own: the caller's ``max_new_tokens`` or ``max_length`` (as
    lm-evaluation-harness passes it) decides, and transformers warns when a config's length and the
    caller's are both set."""
    return GenerationConfig(
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        suppress_tokens=[BOS, PAD],  # a document never restarts mid-stream; padding is never a symbol
    )


def read_run_info(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / "run_info.json"
    return read_json(path) if path.is_file() else {}


def training_stores(info: dict[str, Any]) -> list[Path]:
    """The training stores a run names: as train resolved them (``train_store_paths``, absolute), else
    (a run of an older version) as given to train, taken from the current folder."""
    recorded = info.get("train_store_paths") or info.get("config", {}).get("train_stores", [])
    return [Path(p) for p in recorded]


def teacher_tokenizer_json(source: str | None, info: dict[str, Any]) -> str:
    """The teacher's ``tokenizer.json`` text: from ``source`` (tokenizer.json, model folder or .gguf),
    else the teacher recorded in the training store; checked against the store's vocabulary, with
    every added token the dump treats as special marked special (its literal text is text). Without
    the store (moved, or named relative to another folder) the check cannot be made: refused unless
    ``source`` is given, which is then shipped unchecked (with a warning)."""
    from bytestream.vocab import load_teacher_tokenizer, vocab_from_tokenizer
    from distill.encode import with_specials_marked
    from logit_store.manifest import tokenizer_location
    from logit_store.store import MANIFEST, LogitStore, read_manifest

    stores = training_stores(info)
    found = bool(stores) and (stores[0] / MANIFEST).is_file()
    manifest = read_manifest(stores[0]) if found else {}
    if not found and not source:
        where = f"the training store {stores[0]} is not found" if stores else "the run names no training store"
        raise UserError(f"give --teacher-tokenizer: {where}, so its teacher and vocabulary are unknown")
    if not found:
        print(
            f"warning: the training store {stores[0]} is not found: --teacher-tokenizer {source} is not checked "
            "against the vocabulary the student was trained with",
            file=sys.stderr,
        )
    location = tokenizer_location(stores[0], manifest) if found else None
    if not source and not _teacher_reachable(location or ""):
        raise UserError(
            f"give --teacher-tokenizer: the teacher {location!r} that the training store {stores[0]} "
            "names is not found from here"
        )
    source = source or location
    tokenizer = load_teacher_tokenizer(source)
    vocab = vocab_from_tokenizer(tokenizer)
    if found and not same_tokens(vocab, LogitStore(stores[0]).vocab):
        raise UserError(f"the tokenizer of {source} is not the one the training store {stores[0]} was dumped with")
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    text = json.dumps(with_specials_marked(json.loads(backend.to_str()), vocab), ensure_ascii=False)
    try:
        TeacherTokens(text)
    except ValueError as exc:
        raise UserError(f"{source}: {exc}") from exc
    return text


def _teacher_reachable(teacher: str) -> bool:
    """Whether a store's teacher name can be loaded from here: a path that exists, or a Hub id."""
    return bool(teacher) and (Path(teacher).exists() or is_hub_id(teacher))


def is_hub_id(name: str) -> bool:
    """Whether ``name`` looks like a Hub repo id (``owner/name``) and is no local path."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if name.count("/") != 1 or name.startswith((".", "~")) or Path(name).exists():
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def same_tokens(vocab: TeacherVocab, stored: TeacherVocab) -> bool:
    """Whether a tokenizer's vocabulary is the one a store was dumped with: the same bytes and
    specials, once padded to the store's output rows (Phi-3), whatever the end-of-text names."""
    if stored.size > vocab.size:
        vocab = vocab.padded_to(stored.size)
    return dataclasses.replace(vocab, end_of_text_ids=stored.end_of_text_ids).hash == stored.hash


def trained_context(model: LlamaForCausalLM, info: dict[str, Any]) -> int:
    """Symbols per training sequence: the most positions the student has seen."""
    seq_len = info.get("config", {}).get("seq_len")
    return min(int(seq_len), model.config.max_position_embeddings) if seq_len else model.config.max_position_embeddings


def previous_export(output: Path) -> list[str]:
    """The files an earlier export wrote into ``output`` (to be replaced); refuses a folder holding anything
    else (dotfiles aside) or a record naming anything but regular files inside it. Touches nothing."""
    if not output.exists() and not output.is_symlink():
        return []
    if not output.is_dir():
        raise UserError(f"{output} exists and is not a folder")
    previous = recorded_files(output) if (output / EXPORT_RECORD).exists() else []
    others = foreign_entries(output, previous)
    if others:
        raise UserError(
            f"{output} is not empty and not a bytedistill export (it holds {', '.join(others[:3])}); "
            "give an empty folder (nothing was touched)"
        )
    return previous


def written_files(output: Path, before: dict[str, str]) -> list[str]:
    """The regular files in ``output`` that were not in ``before`` (a :func:`visible_entries` listing)."""
    return sorted(name for name, kind in visible_entries(output).items() if kind == "file" and name not in before)


def export_student(
    checkpoint: Path,
    output: Path,
    *,
    teacher_tokenizer: str | None = None,
    repo_id: str | None = None,
    license: str = "apache-2.0",
    teacher: str | None = None,
    data: str | None = None,
) -> Path:
    """Write the Hugging Face folder for ``checkpoint`` (or an output dir's newest) to ``output``."""
    checkpoint = resolve_checkpoint(checkpoint)
    output = Path(output)
    with export_lock(output):
        note = clean_leftover(output)
        if note:
            print(f"bytedistill export: {note}", file=sys.stderr)
        previous = previous_export(output)
        info = read_run_info(checkpoint)
        model = load_student(checkpoint)  # before the (slow) tokenizer: a damaged checkpoint is refused at once
        tokenizer_json = teacher_tokenizer_json(teacher_tokenizer, info)
        model.config.max_position_embeddings = trained_context(model, info)
        model.generation_config = generation_config()
        card = {"repo_id": repo_id, "license": license, "teacher": teacher, "data": data}
        with staging(output, previous) as staged:
            write_export(staged, model, tokenizer_json, info, **card)
        swap_in(staged, output)
    return output


def write_export(folder: Path, model, tokenizer_json: str, info: dict[str, Any], **card: Any) -> None:
    """Write every file of the export, and its record, into the empty ``folder``."""
    architectures.prepare_export(model, folder)
    model.save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    (folder / TEACHER_TOKENIZER_FILE).write_text(tokenizer_json, encoding="utf-8")
    shutil.copyfile(stream_tokenizer.__file__, folder / REMOTE_CODE_FILE)
    (folder / CUSTOM_GENERATE_FILE).parent.mkdir(exist_ok=True)
    shutil.copyfile(custom_generate.__file__, folder / CUSTOM_GENERATE_FILE)
    config_file = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text(encoding="utf-8"))
    tokenizer_config["auto_map"] = stream_tokenizer.auto_map()
    # a class transformers does not have: without trust_remote_code AutoTokenizer refuses, naming it,
    # instead of silently loading the plain byte tokenizer (which places no <eot>)
    tokenizer_config["tokenizer_class"] = stream_tokenizer.ByteStreamTokenizer.__name__
    config_file.write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")
    model_card(
        info,
        model.config.max_position_embeddings,
        architecture=architectures.architecture_of_model(model),
        architecture_section=architectures.card_section(model, info),
        **card,
    ).save(folder / "README.md")
    write_record(folder, written_files(folder, {}))


# -------------------------------------------------------------------------------- model card

USAGE = """```python
from transformers import AutoModelForCausalLM, AutoTokenizer

repo = "{repo}"  # or a local folder
model = {model_loading}
# the stream tokenizer places the teacher's <eot> marks the student was trained with
tokenizer = AutoTokenizer.from_pretrained(repo, trust_remote_code=True)

# a prompt: the teacher's marks up to its last word, whose bytes generate feeds, the student
# placing the <eot> marks (the word may go on: the student, not the cut, decides where it ends)
inputs = tokenizer.prompt("The meaning of life is")
output = model.generate(**inputs, max_new_tokens=100, do_sample=True, top_k=50)
# skip_special_tokens drops <bos>, <eos> and the <eot> token-boundary symbols
print(tokenizer.decode(output[0], skip_special_tokens=True))

# a complete text (scoring): tokenizer(text) places the teacher's marks throughout
text = tokenizer("In the beginning God created", return_tensors="pt")
nats_per_symbol = model(**text, labels=text.input_ids).loss
```"""


# what the card says differs by architecture in these three places
ARCHITECTURE_NAMES = {
    "flat": "Llama architecture",
    "patched": "patched hierarchical architecture: a global model over the teacher's tokens between a local byte "
    "encoder and decoder",
}
MODEL_LOADING = {
    "flat": "AutoModelForCausalLM.from_pretrained(repo)  # a stock Llama: no remote code",
    "patched": "AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)  # the patched student",
}
MODEL_CODE = {
    "flat": "The model itself loads\nwith `AutoModelForCausalLM` and no remote code.",
    "patched": f"The model (`{architectures.MODELING_FILE}`, importing only `torch`\nand `transformers`) "
    "loads with `AutoModelForCausalLM` and `trust_remote_code=True` too.",
}


def _fmt(value: Any, digits: int = 4) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "not evaluated"


def _training_bytes(train_bytes: int, config: dict[str, Any]) -> str:
    """Bytes read in training, with the training text's own size when its stores are at hand."""
    from logit_store.store import MANIFEST, LogitStore

    stores = [Path(p) for p in config.get("train_stores", [])]
    if not stores or not all((p / MANIFEST).is_file() for p in stores):
        return f"{train_bytes:,} (all epochs)"
    corpus = sum(LogitStore(p).stats()["text_bytes"] for p in stores)
    return f"{train_bytes:,}: {train_bytes / corpus:.1f} passes over a {corpus:,}-byte training text"


def _no_local_path(name: str) -> str:
    """A teacher or data name fit for a public card: a local path (one that exists here, or that
    reads as a path: absolute, ``.``, ``..``, ``~``) becomes its last part."""
    path = Path(name)
    local = path.is_absolute() or path.exists() or name.startswith(("~", ".")) or ".." in path.parts
    return (path.name or name) if local else name


def model_card(
    info: dict[str, Any],
    context: int,
    *,
    repo_id: str | None = None,
    license: str = "apache-2.0",
    teacher: str | None = None,
    data: str | None = None,
    architecture: str = "flat",
    architecture_section: str = "",
) -> ModelCard:
    """README.md: Hub metadata, results table, usage snippet, tokenizer notes and trained context."""
    config = info.get("config", {})
    described = info.get("data", {})
    teacher = _no_local_path(str(teacher or described.get("teacher") or "unknown"))
    data = str(
        data or described.get("corpus") or ", ".join(Path(p).name for p in config.get("train_stores", [])) or "unknown"
    )
    evaluation = info.get("last_eval") or {}
    train_bytes = info.get("train_bytes", 0)
    hub_teacher = is_hub_id(teacher)
    metadata = ModelCardData(
        license=license,
        library_name="transformers",
        pipeline_tag="text-generation",
        base_model=teacher if hub_teacher else None,
        tags=["byte-level", "distillation", "bytedistill"],
        teacher=teacher,
        training_data=data,
        training_bytes=train_bytes,
        trained_context=context,
        heldout_bpb_student=evaluation.get("student_bpb"),
        heldout_bpb_teacher=evaluation.get("teacher_bpb"),
        heldout_kl_bits_per_byte=evaluation.get("kl_per_byte"),
    )
    body = f"""# Byte-level student of {teacher}

A byte-level causal language model ({ARCHITECTURE_NAMES[architecture]}, {info.get("parameters", 0):,} parameters,
260-symbol vocabulary) distilled with bytedistill from the token-level
teacher **{teacher}** using its exact next-byte distributions
(KL weight alpha = {config.get("alpha")}, temperature = {config.get("temperature")}).

| | value |
|---|---|
| teacher | {teacher} |
| training data | {data} |
| text bytes read in training | {_training_bytes(train_bytes, config)} |
| trained context | {context} symbols (bytes and `<eot>` marks) |
| held-out bits per byte, student | {_fmt(evaluation.get("student_bpb"))} |
| held-out bits per byte, teacher | {_fmt(evaluation.get("teacher_bpb"))} |
| KL(teacher ‖ student), bits per byte | {_fmt(evaluation.get("kl_per_byte"))} |
| evaluated on | {evaluation.get("eval_bytes", 0):,} held-out bytes at step {evaluation.get("step", "-")} |

Bits per byte count every symbol's negative log-likelihood (including the `<eot>` token-boundary
and `<eos>` symbols) divided by the number of UTF-8 bytes, so student and teacher are comparable.

{architecture_section}## Usage

{USAGE.format(repo=repo_id or "your-name/byte-student", model_loading=MODEL_LOADING[architecture])}

## Tokenizers: why `trust_remote_code=True`

The student was trained on streams `<bos> bytes(t1) <eot> bytes(t2) <eot> …` whose `<eot>` marks
sit where the teacher's tokenizer ended its tokens. Its tokenizer (`tokenization_bytedistill.py`,
loaded with `trust_remote_code=True`; it imports only `tokenizers` and `transformers`) runs the
teacher's tokenizer (`teacher_tokenizer.json`) on your text only to place those marks; the model
still reads every byte and, while generating, places its own `<eot>` marks. {MODEL_CODE[architecture]}

## Prompts: the cut is not a token boundary

A prompt may stop inside a word ("In the begi"), where the teacher's tokenizer would end a token
that the full text would not. `tokenizer.prompt(text)` therefore commits the teacher's marks only
up to the start of the prompt's last word (its last pre-token) and returns, as `logits_processor`,
a `HealingProcessor` that `generate` uses to feed that word's bytes one by one: at each of them the
model's own scores choose between the byte and `<eot>`, so the student segments the word as it
would had the text gone on, and nothing after the prompt is invented. `bytedistill generate` does
the same. `tokenizer(text)` is for complete texts (scoring): it places the teacher's marks
throughout, as in training.

With `trust_remote_code=True` on the model as well
(`AutoModelForCausalLM.from_pretrained(repo, trust_remote_code=True)`, as lm-evaluation-harness
loads it), `transformers` binds the folder's `custom_generate/generate.py` as `model.generate`: it
heals prompts given as `tokenizer(text)` streams the same way (a first pass feeds the last word, a
second generates with your settings and stopping criteria) and returns your input followed by the
continuation. Without it `generate` is the stock one.

Without `trust_remote_code`, `AutoTokenizer.from_pretrained(repo)` refuses, asking for
`trust_remote_code=True`: the stream tokenizer is code. The plain byte tokenizer is there by name,
`PreTrainedTokenizerFast.from_pretrained(repo)`: `<bos>` + the UTF-8 bytes with no `<eot>` marks,
inputs the model never saw in training, so it scores and continues text noticeably worse (see the
table of loading paths, when measured, below).

Ids 0–255 are the bytes themselves; 256 `<eot>` marks the end of a teacher token, 257 `<bos>`
starts a document, 258 `<eos>` ends it (generation stops there), 259 `<pad>` is padding.
Generated bytes need not be valid UTF-8 (e.g. a cut-off multi-byte character): `decode` then
shows U+FFFD (�) for each invalid sequence; for the exact bytes take `bytes(i for i in ids if i < 256)`.

## Context length

The student was trained on windows of {context} symbols (`max_position_embeddings`); positions past
that were never trained. `bytedistill generate` and `bytedistill score` slide a window of at most
{context} symbols over longer text; with plain `generate`, keep prompt + output within it.

## Evaluation with lm-evaluation-harness

```bash
lm_eval --model hf --tasks wikitext \\
    --model_args pretrained={repo_id or "your-name/byte-student"},trust_remote_code=True
```

`bits_per_byte` of rolling-loglikelihood tasks matches `bytedistill score --packed false`.
`trust_remote_code=True` loads the stream tokenizer and binds `custom_generate/generate.py`, so
generation tasks (`generate_until`) get healed prompts (see "Prompts" above).
"""
    return ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n{body}")
