"""Export a trained student as a plain Hugging Face model folder (issue 6).

The folder holds ``config.json`` + ``model.safetensors`` (a stock Llama), ``generation_config.json``
(``<eos>`` stops generation; ``<bos>``/``<pad>`` ids set and never generated), the byte tokenizer
files and a model card ``README.md`` whose YAML header and table come from the trainer's
``run_info.json`` (teacher, data, training bytes, held-out BPB of student and teacher, KL).
``AutoModelForCausalLM`` and ``AutoTokenizer`` load it with no custom code.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from safetensors.torch import load_file
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from distill.alphabet import BOS, EOS, PAD
from distill.errors import UserError
from students.tokenizer import build_tokenizer
from students.checkpoints import latest_checkpoint


def resolve_checkpoint(path: Path) -> Path:
    """A checkpoint directory itself, or the newest checkpoint of a training output directory."""
    path = Path(path)
    if (path / "trainer_state.json").is_file():
        return path
    if path.is_dir() and (found := latest_checkpoint(path)) is not None:
        return found
    raise UserError(f"{path} is neither a training checkpoint nor an output directory with checkpoints")


def load_student(checkpoint: Path) -> LlamaForCausalLM:
    """The student saved in a trainer checkpoint (config.json + model.safetensors), in eval mode."""
    config_file, weights_file = checkpoint / "config.json", checkpoint / "model.safetensors"
    for needed in (config_file, weights_file):
        if not needed.is_file():
            raise UserError(f"checkpoint {checkpoint} lacks {needed.name}")
    model = LlamaForCausalLM(LlamaConfig.from_json_file(str(config_file)))
    missing, unexpected = model.load_state_dict(load_file(str(weights_file)), strict=False)
    tied = {"lm_head.weight"} if model.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise UserError(f"{weights_file} does not match its config: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    return model.eval()


def generation_config() -> GenerationConfig:
    return GenerationConfig(
        bos_token_id=BOS,
        eos_token_id=EOS,
        pad_token_id=PAD,
        suppress_tokens=[BOS, PAD],  # a document never restarts mid-stream; padding is never a symbol
        max_new_tokens=256,
    )


def read_run_info(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / "run_info.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def export_student(
    checkpoint: Path,
    output: Path,
    *,
    repo_id: str | None = None,
    license: str = "apache-2.0",
    teacher: str | None = None,
    data: str | None = None,
) -> Path:
    """Write the Hugging Face folder for ``checkpoint`` (or an output dir's newest) to ``output``."""
    checkpoint = resolve_checkpoint(checkpoint)
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    model = load_student(checkpoint)
    model.generation_config = generation_config()
    model.save_pretrained(output)
    build_tokenizer().save_pretrained(output)
    card = model_card(read_run_info(checkpoint), repo_id=repo_id, license=license, teacher=teacher, data=data)
    (output / "README.md").write_text(card, encoding="utf-8")
    return output


# -------------------------------------------------------------------------------- model card

USAGE = '''```python
from transformers import AutoModelForCausalLM, AutoTokenizer

repo = "{repo}"  # or a local folder
tokenizer = AutoTokenizer.from_pretrained(repo)
model = AutoModelForCausalLM.from_pretrained(repo)

inputs = tokenizer("The meaning of life is", return_tensors="pt")  # <bos> + the UTF-8 bytes
output = model.generate(**inputs, max_new_tokens=100, do_sample=True, top_k=50)
# skip_special_tokens drops <bos>, <eos> and the <eot> token-boundary symbols
print(tokenizer.decode(output[0], skip_special_tokens=True))
```'''


def _fmt(value: Any, digits: int = 4) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "not evaluated"


def _yaml_scalar(value: Any) -> str:
    return json.dumps(value)  # JSON strings and numbers are valid YAML scalars


def model_card(
    info: dict[str, Any],
    *,
    repo_id: str | None = None,
    license: str = "apache-2.0",
    teacher: str | None = None,
    data: str | None = None,
) -> str:
    """README.md text: Hub metadata header, results table, usage snippet, tokenizer notes."""
    config = info.get("config", {})
    described = info.get("data", {})
    teacher = teacher or described.get("teacher") or "unknown"
    data = data or described.get("corpus") or ", ".join(config.get("train_stores", [])) or "unknown"
    if not isinstance(teacher, str):
        teacher = json.dumps(teacher)
    if not isinstance(data, str):
        data = json.dumps(data)
    evaluation = info.get("last_eval") or {}
    train_bytes = info.get("train_bytes", 0)
    alpha = config.get("alpha")
    meta = {
        "license": license,
        "library_name": "transformers",
        "pipeline_tag": "text-generation",
        "teacher": teacher,
        "training_data": data,
        "training_bytes": train_bytes,
        "heldout_bpb_student": evaluation.get("student_bpb"),
        "heldout_bpb_teacher": evaluation.get("teacher_bpb"),
        "heldout_kl_bits_per_byte": evaluation.get("kl_per_byte"),
    }
    header = ["---"] + [f"{k}: {_yaml_scalar(v)}" for k, v in meta.items() if v is not None]
    if re.fullmatch(r"[\w.-]+/[\w.-]+", teacher):
        header.append(f"base_model: {_yaml_scalar(teacher)}")
    header += ["tags:", "  - byte-level", "  - distillation", "  - bytedistill", "---", ""]
    body = f"""# Byte-level student of {teacher}

A byte-level causal language model (Llama architecture, {info.get('parameters', 0):,} parameters,
260-symbol vocabulary) distilled with bytedistill from the token-level
teacher **{teacher}** using its exact next-byte distributions
(KL weight alpha = {alpha}, temperature = {config.get('temperature')}).

| | value |
|---|---|
| teacher | {teacher} |
| training data | {data} |
| training bytes | {train_bytes:,} |
| held-out bits per byte, student | {_fmt(evaluation.get('student_bpb'))} |
| held-out bits per byte, teacher | {_fmt(evaluation.get('teacher_bpb'))} |
| KL(teacher ‖ student), bits per byte | {_fmt(evaluation.get('kl_per_byte'))} |
| evaluated on | {evaluation.get('eval_bytes', 0):,} held-out bytes at step {evaluation.get('step', '-')} |

Bits per byte count every symbol's negative log-likelihood (including the `<eot>` token-boundary
and `<eos>` symbols) divided by the number of UTF-8 bytes, so student and teacher are comparable.

## Usage

{USAGE.format(repo=repo_id or "your-name/byte-student")}

## Vocabulary and tokenizer

Ids 0–255 are the bytes themselves; 256 `<eot>` marks the end of a teacher token, 257 `<bos>`
starts a document, 258 `<eos>` ends it (generation stops there), 259 `<pad>` is padding.
The tokenizer turns text into `<bos>` + its UTF-8 bytes. The model was trained on streams that
contain `<eot>` after each teacher token and generates them too; `decode(...,
skip_special_tokens=True)` drops them. A prompt is given as plain bytes without `<eot>` marks.
Generated bytes need not be valid UTF-8 (e.g. a cut-off multi-byte character): `decode` then
shows U+FFFD (�) for each invalid sequence; for the exact bytes take `bytes(i for i in ids if i < 256)`.
"""
    return "\n".join(header) + body
