"""Export a trained student as a Hugging Face model folder.

The folder holds ``config.json`` + ``model.safetensors`` (the student of a checkpoint,
:mod:`students.release.trained_student`, whose ``max_position_embeddings`` is the trained context, with
any files its architecture ships), ``generation_config.json`` (``<eos>`` stops generation;
``<bos>``/``<pad>`` never generated), two tokenizers and a model card ``README.md``
(:mod:`students.release.card`):

- the stream tokenizer (``AutoTokenizer.from_pretrained(folder, trust_remote_code=True)``):
  ``tokenization_bytedistill.py`` (a copy of :mod:`bytestream.stream_tokenizer`) and the teacher's
  ``teacher_tokenizer.json`` (checked against the training store,
  :mod:`students.release.teacher_check`); it gives the student the training stream with the
  teacher's ``<eot>`` marks;
- for an ``<eot>``-stream student, the plain byte tokenizer (``tokenizer.json``;
  ``PreTrainedTokenizerFast``, no remote code): bytes without ``<eot>`` marks, which the student
  never saw in training (worse BPB, stated in the card); a fused student has none (its
  ``tokenizer_config.json`` is the stream tokenizer's, ``byte_stream: "fused"``);
- ``custom_generate/generate.py`` (a copy of :mod:`students.release.custom_generate`): with
  ``trust_remote_code=True`` on the model too, ``model.generate`` heals prompts given as complete
  streams (lm-evaluation-harness's generation tasks).

A bytes-stream student's folder is plain instead: the stock byte tokenizer (``tokenizer.json``,
``tokenizer_config.json``, a chat student's ``chat_template.jinja``; :mod:`students.release.bytes_tokenizer`)
beside the stock Llama, no code and no teacher tokenizer, so ``AutoTokenizer`` and
``AutoModelForCausalLM`` load it without ``trust_remote_code``.

``bytedistill_export.json`` records every file export wrote (:mod:`students.release.export_record`); ``push``
uploads only those, and a new export into the folder replaces them. A folder holding anything else
(dotfiles aside), or whose record names anything but regular files inside it, is refused before a
file is touched. The new export is written beside the old one and swapped in only when complete,
one export into a folder at a time (:mod:`students.release.export_staging`): a failure leaves the old one whole.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from transformers import GenerationConfig

from bytestream import stream_tokenizer
from bytestream.stream_kind import StreamKind
from bytestream.stream_tokenizer import TEACHER_TOKENIZER_FILE, ByteStreamTokenizer
from bytestream.teacher_tokens import turn_ending_texts
from common.errors import UserError
from students.models.architectures import architecture_of_model
from students.release import custom_generate
from students.release.bytes_tokenizer import bytes_chat_template, plain_tokenizer
from students.release.card import LICENSE, card_section, model_card
from students.release.export_record import previous_export, write_record, written_files
from students.release.export_staging import clean_leftover, export_lock, staging, swap_in
from students.release.teacher_check import PLAIN, TeacherChat, recorded_chat, teacher_files, training_manifest
from students.release.tokenizer import build_tokenizer
from students.release.trained_student import load_student, read_run_info, resolve_checkpoint, trained_context

REMOTE_CODE_FILE = "tokenization_bytedistill.py"
CUSTOM_GENERATE_FILE = "custom_generate/generate.py"  # transformers binds it as model.generate (trust_remote_code)


def generation_config(stream: StreamKind = StreamKind.EOT, end_of_turn: list[int] | None = None) -> GenerationConfig:
    """Stop at the stream's ``<eos>`` (and a chat student at the end of its turn: the
    ``end_of_turn`` symbols). No length of its own: the caller's ``max_new_tokens`` or
    ``max_length`` (as lm-evaluation-harness passes it) decides, and transformers warns when a
    config's length and the caller's are both set."""
    return GenerationConfig(
        bos_token_id=stream.bos,
        eos_token_id=[stream.eos, *end_of_turn] if end_of_turn else stream.eos,
        pad_token_id=stream.pad,
        suppress_tokens=[stream.bos, stream.pad],  # a document never restarts mid-stream; padding is never a symbol
    )


def export_student(
    checkpoint: Path,
    output: Path,
    *,
    teacher_tokenizer: str | None = None,
    repo_id: str | None = None,
    license: str = LICENSE,
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
        tokenizer_json, chat = student_chat(model, teacher_tokenizer, info)
        if chat.reserved_symbols != list(getattr(model.config, "reserved_symbols", None) or []):
            raise UserError(
                f"the training store's reserved symbols {chat.reserved_symbols} are not the student's "
                f"{getattr(model.config, 'reserved_symbols', None) or []}"
            )
        model.config.max_position_embeddings = trained_context(model, info)
        stream = StreamKind.of_config(model.config)
        model.generation_config = generation_config(stream, end_of_turn_symbols(stream, chat))
        card = {"repo_id": repo_id, "license": license, "teacher": teacher, "data": data}
        with staging(output, previous) as staged:
            write_export(staged, model, tokenizer_json, info, chat=chat, **card)
        swap_in(staged, output)
    return output


def student_chat(model, teacher_tokenizer: str | None, info: dict[str, Any]) -> tuple[str, TeacherChat]:
    """The teacher tokenizer an export ships and the student's chat settings. A bytes student ships no
    teacher tokenizer and reads no teacher: its chat settings are the ones the training store's manifest
    records (none for a plain student); only a store that records none (older) is read with the teacher's."""
    if StreamKind.of_config(model.config) is StreamKind.BYTES:
        if not getattr(model.config, "reserved_symbols", None):
            return "", PLAIN
        manifest = training_manifest(info)
        chat = recorded_chat(manifest) if manifest is not None else None
        if chat is not None:
            return "", chat
    return teacher_files(teacher_tokenizer, info)


def end_of_turn_symbols(stream: StreamKind, chat: TeacherChat) -> list[int]:
    """The reserved symbols at which a chat student's turn ends (none for a plain student): the ones
    the training store records (found from its template by the dump); for a store of an older version,
    which records none, the teacher's end-of-text text and the usual end-of-turn names."""
    if not chat.reserved_symbols:
        return []
    ends = turn_ending_texts(chat.end_of_turn, chat.template_tokens.get("eos_token"))
    return [stream.alphabet_size + i for i, text in enumerate(chat.reserved_symbols) if text in ends]


def write_export(
    folder: Path, model, tokenizer_json: str, info: dict[str, Any], chat: TeacherChat = PLAIN, **card: Any
) -> None:
    """Write every file of the export, and its record, into the empty ``folder``."""
    architecture = architecture_of_model(model)
    stream = StreamKind.of_config(model.config)
    architecture.export_files(model, folder)
    model.save_pretrained(folder)
    if stream is StreamKind.BYTES:
        write_plain_tokenizer(folder, chat, model.config.max_position_embeddings)
    else:
        write_stream_tokenizer(folder, stream, tokenizer_json, chat)
    model_card(
        info,
        model.config.max_position_embeddings,
        architecture=architecture,
        stream=stream,
        architecture_section=card_section(model, info),
        reserved=chat.reserved_symbols,
        **card,
    ).save(folder / "README.md")
    write_record(folder, written_files(folder, {}))


def write_plain_tokenizer(folder: Path, chat: TeacherChat, context: int) -> None:
    """A bytes student's tokenizer: the stock byte tokenizer, with the chat template of a chat student
    (no code, no teacher tokenizer: :mod:`students.release.bytes_tokenizer`), its length the trained context."""
    template = None
    if chat.reserved_symbols and chat.template:
        template = bytes_chat_template(chat.template, chat.template_tokens, chat.prefix)
    tokenizer = plain_tokenizer(chat.reserved_symbols, template)
    tokenizer.model_max_length = context
    tokenizer.save_pretrained(folder)
    config_file = folder / "tokenizer_config.json"
    tokenizer_config = json.loads(config_file.read_text(encoding="utf-8"))
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"  # the stock class's name in every transformers
    config_file.write_text(json.dumps(tokenizer_config, indent=2) + "\n", encoding="utf-8")


def write_stream_tokenizer(folder: Path, stream: StreamKind, tokenizer_json: str, chat: TeacherChat) -> None:
    """An ``<eot>`` or fused student's tokenizers: the stream tokenizer (code, with the teacher's
    tokenizer), the healing ``generate``, and for a plain ``<eot>`` student the plain byte tokenizer by name."""
    (folder / TEACHER_TOKENIZER_FILE).write_text(tokenizer_json, encoding="utf-8")
    if stream is StreamKind.EOT and not chat.reserved_symbols:
        build_tokenizer().save_pretrained(folder)
    else:  # no plain byte tokenizer: the stream tokenizer's own config, naming its stream (and its chat)
        teacher_file = str(folder / TEACHER_TOKENIZER_FILE)
        ByteStreamTokenizer(
            teacher_tokenizer_file=teacher_file, byte_stream=stream.value, **chat.tokenizer_kwargs()
        ).save_pretrained(folder)
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
