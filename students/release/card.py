"""The model card (``README.md``) of an exported student: Hub metadata, results table, the
architecture's section (sizes, cost, measured speed), usage, tokenizer notes and trained context.
What differs by architecture the architecture object says (:mod:`students.models.architecture`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from bytestream.stream_kind import StreamKind
from students.models.architecture import Architecture
from students.models.architectures import DEFAULT, architecture_of_model

if TYPE_CHECKING:
    from huggingface_hub import ModelCard

# What the card says when ``export`` is not told otherwise, shared by the library
# (:func:`students.release.export.export_student`, :func:`model_card`) and the ``export`` flags.
# This module imports no torch, transformers or Hub client at its top (they load in
# :func:`model_card`), so ``bytedistill export --help`` reads these without them.
LICENSE = "apache-2.0"  # the card's metadata license (--license)

USAGE = """```python
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

repo = "{repo}"  # or a local folder
model = {model_loading}
# the stream tokenizer places the teacher's {marks} the student was trained with
tokenizer = AutoTokenizer.from_pretrained(repo, trust_remote_code=True)

# a prompt: the teacher's marks up to its last word, whose bytes generate feeds, the student
# placing the {marks} (the word may go on: the student, not the cut, decides where it ends);
# pass all of inputs: its input_ids alone stop before the last word, which its logits_processor feeds
inputs = tokenizer.prompt("The meaning of life is")
output = model.generate(**inputs, max_new_tokens=100, do_sample=True, top_k=50)
# {decoded}
print(tokenizer.decode(output[0], skip_special_tokens=True))

# a complete text (scoring): tokenizer(text) places the teacher's marks throughout
text = tokenizer("In the beginning God created", return_tensors="pt")
with torch.no_grad():
    nats_per_symbol = model(**text, labels=text.input_ids).loss.item()
```"""

COMPILED_USAGE = """Long generations run faster with the decode step compiled: caches allocated once
(`cache_implementation="static"`) and a `compile_config`, `transformers`' own options (on a CPU,
inductor's C++ with the system's compiler; on a GPU, `CompileConfig(fullgraph=True)`: CUDA graphs).
Compiling takes seconds to minutes per batch size, so it pays for long generations; greedy, the symbols are those of eager decoding.

```python
from transformers import CompileConfig

compiled = CompileConfig(fullgraph=True, mode=None, options={"cpp_wrapper": True})
compiled._compile_all_devices = True  # transformers compiles on accelerators only unless told
output = model.generate(**inputs, max_new_tokens=200, do_sample=False,
                        cache_implementation="static", compile_config=compiled)
```"""

STREAM_TEXT = {  # what the card says that depends on the stream the student reads
    StreamKind.EOT: {
        "marks": "<eot> marks",
        "own_marks": "`<eot>` marks",
        "decoded": "skip_special_tokens drops <bos>, <eos> and the <eot> token-boundary symbols",
        "context_unit": "bytes and `<eot>` marks",
        "counted": "including the `<eot>` token-boundary\nand `<eos>` symbols",
        "stream": "streams `<bos> bytes(t1) <eot> bytes(t2) <eot> …` whose `<eot>` marks\nsit where the teacher's "
        "tokenizer ended its tokens",
        "choice": "between the byte and `<eot>`",
        "plain": "The plain byte tokenizer is there by name,\n`PreTrainedTokenizerFast.from_pretrained(repo)`: "
        "`<bos>` + the UTF-8 bytes with no `<eot>` marks,\ninputs the model never saw in training, so it scores and "
        "continues text noticeably worse (see the\ntable of loading paths, when measured, below).",
        "ids": "Ids 0–255 are the bytes themselves; 256 `<eot>` marks the end of a teacher token, 257 `<bos>`\n"
        "starts a document, 258 `<eos>` ends it (generation stops there), 259 `<pad>` is padding.",
        "exact": "`bytes(i for i in ids if i < 256)`",
    },
    StreamKind.FUSED: {
        "marks": "token-end flags",
        "own_marks": "token-end flags",
        "decoded": "decode gives each byte once, flagged or not; skip_special_tokens drops <bos> and <eos>",
        "context_unit": "one per text byte",
        "counted": "each byte's symbol carries its token-boundary\nflag; `<eos>` included",
        "stream": "the fused stream `<bos> f(t1) f(t2) …`: one symbol per text byte, each\nteacher token's "
        "last byte flagged where the teacher's tokenizer ended it",
        "choice": "between the byte's two symbols (its token ends there,\nor goes on), one step per byte",
        "plain": "The folder has no plain byte\ntokenizer: bytes that flag no token end are a stream the model "
        "never saw in training.",
        "ids": "Ids 0–255 are the bytes inside a teacher token, 256 + b the byte b that ends its token, 512\n"
        "`<bos>` starts a document, 513 `<eos>` ends it (generation stops there), 514 `<pad>` is padding.",
        "exact": "`bytes(i % 256 for i in ids if i < 512)`\n(or `tokenizer.text_bytes(ids)`)",
    },
}


STREAM_TEXT[StreamKind.BYTES] = {  # the bytes student's card shares only the results table's words
    "context_unit": "one per text byte",
    "counted": "one symbol per byte; `<eos>` included",
}

BYTES_USAGE = """## Usage

A stock `transformers` Llama with a stock byte tokenizer: no `trust_remote_code`, no code of ours, no
teacher tokenizer. Each byte of the UTF-8 text is one token (ids 0–255 are the bytes themselves), then
256 `<bos>` (it opens every text), 257 `<eos>` (generation stops there), 258 `<pad>`{reserved_ids}.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

repo = "{repo}"  # or a local folder
model = AutoModelForCausalLM.from_pretrained(repo)
tokenizer = AutoTokenizer.from_pretrained(repo)  # padding on the left, for batches of prompts

inputs = tokenizer(["The meaning of life is", "In the begi"], return_tensors="pt", padding=True)
output = model.generate(**inputs, max_new_tokens=100, do_sample=False)
print(tokenizer.batch_decode(output[:, inputs.input_ids.shape[1]:], skip_special_tokens=True))
```

A prompt may stop anywhere, inside a word or inside a character: the student reads plain bytes and
was trained on the teacher's next-byte distribution with the teacher's token boundaries summed out,
so there is no boundary to place and nothing to heal. `bytedistill generate`, `chat`, `score` and
`serve` run the folder as it is.

Generated bytes need not be valid UTF-8 (e.g. a cut-off multi-byte character): `decode` then shows
U+FFFD (�) for each invalid sequence; for the exact bytes take `bytes(i for i in ids if i < 256)`.
{plain_note}
## Context length

The student was trained on windows of {context} symbols, one per byte (`max_position_embeddings`);
positions past that were never trained. `bytedistill generate` and `bytedistill score` slide a window
of at most {context} symbols over longer text; with plain `generate`, keep prompt + output within it.

## Evaluation with lm-evaluation-harness

```bash
lm_eval --model hf --tasks wikitext --model_args pretrained={repo},add_bos_token=False
```

For rolling-loglikelihood tasks (`bits_per_byte`) pass `add_bos_token=False`: the harness reads the
tokenizer's `<bos>` before the first window itself, and would otherwise score a second `<bos>` as the
first symbol. Then the `bits_per_byte` of a document that fits one window ({context} symbols) is
`bytedistill score --packed false`'s less its end-of-text term (the harness does not score `<eos>`);
over longer documents the harness gives each last window a full context, so the figures differ a
little. Generation tasks (`generate_until`) take the tokenizer as it is (`<bos>` first), and continue a
prompt cut anywhere as `bytedistill generate --greedy` does.
"""

BYTES_CHAT_USAGE = """```python
from transformers import AutoModelForCausalLM, AutoTokenizer

repo = "{repo}"  # or a local folder
model = AutoModelForCausalLM.from_pretrained(repo)
tokenizer = AutoTokenizer.from_pretrained(repo)

messages = [{{"role": "user", "content": "What is the capital of France?"}}]
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
room = model.config.max_position_embeddings - inputs["input_ids"].shape[1]  # the rest of the trained context
output = model.generate(**inputs, max_new_tokens=room, do_sample=False)  # stops at the end of its turn
answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
```

Or in a terminal: `bytedistill chat {repo}`."""


def _bytes_sections(reserved: list[str], evaluation: dict[str, Any], repo: str, context: int) -> str:
    """A bytes student's "Chatting" and usage sections: everything loads without remote code."""
    stream = StreamKind.BYTES
    chat = ""
    if reserved:
        symbols = ", ".join(f"`{text}` {stream.alphabet_size + i}" for i, text in enumerate(reserved))
        chat = f"""## Chatting

The student was distilled on conversations rendered by the teacher's chat template, which the folder
ships (`chat_template.jinja`); the teacher's chat specials are symbols of their own ({symbols}) and the
tokenizer reads their texts as those symbols. `tokenizer.apply_chat_template(...)` gives the stream the
student was trained on, and `generate` stops at the end of its turn (`generation_config.json`'s
`eos_token_id`).

{BYTES_CHAT_USAGE.format(repo=repo)}

"""
    ids = "".join(f", {stream.alphabet_size + i} `{text}`" for i, text in enumerate(reserved))
    note = (
        ""
        if reserved
        else "\nThe tokenizer reads any text as its bytes: the text `<eos>` is five bytes, never the symbol.\n"
    )
    return chat + BYTES_USAGE.format(repo=repo, context=context, reserved_ids=ids, plain_note=note)


CHAT_USAGE = """```python
from transformers import AutoModelForCausalLM, AutoTokenizer

repo = "{repo}"  # or a local folder
model = {model_loading}
tokenizer = AutoTokenizer.from_pretrained(repo, trust_remote_code=True)

context = model.config.max_position_embeddings  # the trained context, in symbols
room = context // 2  # symbols left for each answer


# the student's next turn; a conversation too long for the context is read from its latest whole
# turns: the oldest question and its answer are left out, a pair at a time (a system prompt stays)
def answer(messages: list[dict]) -> str:
    system = messages[:1] if messages[0]["role"] == "system" else []
    turns = messages[len(system) :]
    while True:
        inputs = tokenizer.apply_chat_template(system + turns, add_generation_prompt=True, return_tensors="pt")
        prompt = inputs["input_ids"].shape[1]
        if prompt + room <= context or len(turns) == 1:
            break
        turns = turns[2:]
    output = model.generate(**inputs, max_new_tokens=room, do_sample=False)  # stops at the end of its turn
    return tokenizer.decode(output[0, prompt:], skip_special_tokens=True)


messages = [{{"role": "user", "content": "What is the capital of France?"}}]
for question in ["And of Italy?", "And of Spain?", "Which of the three is the largest?"]:
    messages.append({{"role": "assistant", "content": answer(messages)}})  # the whole conversation is kept
    messages.append({{"role": "user", "content": question}})
print(answer(messages))
```

Or in a terminal: `bytedistill chat {repo}` (one user turn a line; the answer is shown as it is
written)."""


def _chat_section(reserved: list[str], stream: StreamKind, evaluation: dict[str, Any], repo: str, loading: str) -> str:
    """The card's "Chatting" section: the reserved symbols, the assistant-only figures, a conversation in Python."""
    if not reserved:
        return ""
    symbols = ", ".join(f"`{text}` {stream.alphabet_size + i}" for i, text in enumerate(reserved))
    figures = ""
    if evaluation.get("assistant_student_bpb") is not None:
        figures = (
            f"On the held-out conversations the student reads the assistant's turns at "
            f"{_fmt(evaluation.get('assistant_student_bpb'))} bits per byte, the teacher at "
            f"{_fmt(evaluation.get('assistant_teacher_bpb'))} (their end-of-turn symbols included).\n\n"
        )
    return f"""## Chatting

The student was distilled on conversations rendered by the teacher's chat template, which the folder
ships (`chat_template.jinja`): the teacher's chat specials are symbols of their own ({symbols}),
so the student learnt where a turn begins and ends, and `generate` stops at the end of its turn
(`generation_config.json`'s `eos_token_id`). `tokenizer.apply_chat_template(...)` gives the stream it
was trained on, and `decode(..., skip_special_tokens=True)` drops the specials.

{figures}{CHAT_USAGE.format(repo=repo, model_loading=loading)}

"""


def _fmt(value: Any, digits: int = 4) -> str:
    return f"{value:.{digits}f}" if isinstance(value, (int, float)) else "not evaluated"


def _training_bytes(train_bytes: int, config: dict[str, Any]) -> str:
    """Bytes read in training, with the training text's own size when its stores are at hand."""
    from logit_store import LogitStore
    from logit_store.file_names import MANIFEST

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
    license: str = LICENSE,
    teacher: str | None = None,
    data: str | None = None,
    architecture: Architecture = DEFAULT,
    architecture_section: str = "",
    stream: StreamKind = StreamKind.EOT,
    reserved: list[str] | None = None,
) -> ModelCard:
    """README.md: Hub metadata, results table, usage snippet (a conversation for a chat student:
    ``reserved`` its chat specials), tokenizer notes and trained context, in the words of the stream
    the student reads."""
    from huggingface_hub import ModelCard, ModelCardData

    from students.release.teacher_check import is_hub_id  # loads the stream tokenizer: transformers

    reserved = list(reserved or [])
    says = STREAM_TEXT[stream]
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
        tags=[
            "byte-level",
            "distillation",
            "bytedistill",
            *(["fused-stream"] if stream is StreamKind.FUSED else []),
            *(["conversational"] if reserved else []),
        ],
        teacher=teacher,
        training_data=data,
        training_bytes=train_bytes,
        trained_context=context,
        heldout_bpb_student=evaluation.get("student_bpb"),
        heldout_bpb_teacher=evaluation.get("teacher_bpb"),
        heldout_kl_bits_per_byte=evaluation.get("kl_per_byte"),
    )
    body = f"""# Byte-level student of {teacher}

A byte-level causal language model ({architecture.card_name}, {info.get("parameters", 0):,} parameters,
{stream.alphabet_size + len(reserved)}-symbol vocabulary) distilled with bytedistill from the token-level
teacher **{teacher}** using its exact next-byte distributions
(KL weight alpha = {config.get("alpha")}, temperature = {config.get("temperature")}).

| | value |
|---|---|
| teacher | {teacher} |
| training data | {data} |
| text bytes read in training | {_training_bytes(train_bytes, config)} |
| trained context | {context} symbols ({says["context_unit"]}) |
| held-out bits per byte, student | {_fmt(evaluation.get("student_bpb"))} |
| held-out bits per byte, teacher | {_fmt(evaluation.get("teacher_bpb"))} |
| KL(teacher ‖ student), bits per byte | {_fmt(evaluation.get("kl_per_byte"))} |
| evaluated on | {evaluation.get("eval_bytes", 0):,} held-out bytes at step {evaluation.get("step", "-")} |

Bits per byte count every symbol's negative log-likelihood ({says["counted"]}) divided by the number of UTF-8 bytes, so student and teacher are comparable.

{architecture_section}"""
    repo = repo_id or "your-name/byte-student"
    if stream is StreamKind.BYTES:
        body += _bytes_sections(reserved, evaluation, repo, context)
    else:
        body += _stream_sections(architecture, stream, reserved, evaluation, repo, context)
    return ModelCard(f"---\n{metadata.to_yaml()}\n---\n\n{body}")


def _stream_sections(
    architecture: Architecture,
    stream: StreamKind,
    reserved: list[str],
    evaluation: dict[str, Any],
    repo: str,
    context: int,
) -> str:
    """An ``<eot>`` or fused student's "Chatting", usage and tokenizer sections: its stream tokenizer is code."""
    says = STREAM_TEXT[stream]
    return f"""{_chat_section(reserved, stream, evaluation, repo, architecture.card_loading)}## Usage

{USAGE.format(repo=repo, model_loading=architecture.card_loading, **says)}

{COMPILED_USAGE}

## Tokenizers: why `trust_remote_code=True`

The student was trained on {says["stream"]}. Its tokenizer (`tokenization_bytedistill.py`,
loaded with `trust_remote_code=True`; it imports only `tokenizers` and `transformers`) runs the
teacher's tokenizer (`teacher_tokenizer.json`) on your text only to place those marks; the model
still reads every byte and, while generating, places its own {says["own_marks"]}. {architecture.card_code}

## Prompts: the cut is not a token boundary

A prompt may stop inside a word ("In the begi"), where the teacher's tokenizer would end a token
that the full text would not. `tokenizer.prompt(text)` therefore commits the teacher's marks only
up to the start of the prompt's last word (its last pre-token) and returns, as `logits_processor`,
a `HealingProcessor` that `generate` uses to feed that word's bytes one by one: at each of them the
model's own scores choose {says["choice"]}, so the student segments the word as it
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
`trust_remote_code=True`: the stream tokenizer is code. {says["plain"]}

{says["ids"]}
Generated bytes need not be valid UTF-8 (e.g. a cut-off multi-byte character): `decode` then
shows U+FFFD (�) for each invalid sequence; for the exact bytes take {says["exact"]}.

## Context length

The student was trained on windows of {context} symbols (`max_position_embeddings`); positions past
that were never trained. `bytedistill generate` and `bytedistill score` slide a window of at most
{context} symbols over longer text; with plain `generate`, keep prompt + output within it.

## Evaluation with lm-evaluation-harness

```bash
lm_eval --model hf --tasks wikitext \\
    --model_args pretrained={repo},trust_remote_code=True
```

`bits_per_byte` of rolling-loglikelihood tasks matches `bytedistill score --packed false`.
`trust_remote_code=True` loads the stream tokenizer and binds `custom_generate/generate.py`, so
generation tasks (`generate_until`) get healed prompts (see "Prompts" above).
"""


def card_section(model, info: dict) -> str:
    """The model card's "Architecture" section: sizes, FLOPs and large-model steps per byte, measured speed."""
    import torch

    from students.models.cost import StreamRates
    from students.models.speed import generation_speed

    architecture = architecture_of_model(model)
    cost = architecture.cost(model)
    rates = info.get("data", {}).get("rates")
    context = model.config.max_position_embeddings
    rows = [
        ("architecture", architecture.name),
        ("sizes", architecture.card_sizes(model.config)),
        ("parameters", f"{cost.parameters:,} (global {cost.global_parameters:,}, local {cost.local_parameters:,})"),
    ]
    if rates:
        r = StreamRates(**rates)
        rows += [
            ("training FLOPs per text byte", f"{cost.train_flops_per_symbol(r, context) * r.symbols_per_byte:.3g}"),
            (
                f"generation FLOPs per text byte (context {context})",
                f"{cost.generate_flops_per_symbol(r, context) * r.symbols_per_byte:.3g}",
            ),
            ("large-model steps per text byte", f"{cost.global_steps_per_byte(r):.3f}"),
            ("KV-cache bytes per text byte of context", f"{cost.kv_bytes_per_byte(r):,.0f}"),
        ]
    speed = generation_speed(
        model, torch.full((1, 1), StreamKind.of_config(model.config).bos), new_symbols=min(128, context - 1)
    )
    threads = torch.get_num_threads()
    cpu = f"CPU with {threads} thread{'' if threads == 1 else 's'}"
    rows.append(
        (
            "generation speed (measured by `bytedistill export`)",
            (
                f"{speed.symbols_per_s:,.0f} symbols/s: {speed.new_symbols} greedy symbols after `<bos>`, batch 1, "
                f'{cpu}, caches on, eager (`generate --compile` decodes compiled: docs/RESULTS.md, "Generation", '
                "in the toolkit's repository)"
            ),
        )
    )
    table = "\n".join(f"| {name} | {value} |" for name, value in rows)
    return f"## Architecture\n\n| | |\n|---|---|\n{table}\n\n"
