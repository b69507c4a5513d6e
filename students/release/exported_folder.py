"""Load an exported student folder with this library's own classes: the model through
``AutoModelForCausalLM``, with which every architecture registers its class first
(:func:`students.models.architectures.register_auto_classes`), and the stream tokenizer as
:class:`~bytestream.stream_tokenizer.ByteStreamTokenizer` (a bytes student's stock byte tokenizer as
:class:`~students.release.bytes_tokenizer.BytesTokenizer`). No code of the folder runs: a folder
naming code export does not write is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from bytestream.stream_kind import StreamKind
from bytestream.stream_tokenizer import TEACHER_TOKENIZER_FILE, ByteStreamTokenizer
from common.errors import UserError, first_line
from students.models.architectures import known_auto_maps, register_auto_classes
from students.release.bytes_tokenizer import BytesTokenizer

WEIGHT_PROBLEMS = {"missing_keys": "missing", "unexpected_keys": "unexpected", "mismatched_keys": "mis-shaped"}


def _tensor_name(key) -> str:
    """A load report's key: a name, or (name, shape in the file, shape the config gives) for a mis-shaped one."""
    if isinstance(key, tuple):
        name, in_file, expected = key
        return f"{name} ({list(in_file)} in the file, {list(expected)} by config.json)"
    return str(key)


def load_model(folder: Path, *, weights: bool = True):
    """The exported student in eval mode (``weights=False``: on the meta device, no tensor loaded).

    It is first built on the meta device, reading of the weights only their header (names, shapes,
    file length): a folder that does not load, or whose weights do not match its config.json
    (missing, unexpected or mis-shaped tensors, which transformers would fill with random values),
    is refused in one line before any memory is allocated for it; so is a corrupt generation_config.json.
    """
    _check_generation_config(Path(folder))
    model = _from_pretrained(folder, device_map="meta")
    return _from_pretrained(folder).eval() if weights else model.eval()


def _check_generation_config(folder: Path) -> None:
    """transformers falls back to defaults (no ``<eos>`` stop, ``<bos>`` allowed) when this file is corrupt."""
    from transformers import GenerationConfig

    if (folder / "generation_config.json").is_file():
        try:
            GenerationConfig.from_pretrained(folder)
        except Exception as exc:  # a corrupt file raises OSError, ValueError or a JSON error
            raise UserError(f"{folder / 'generation_config.json'} does not load: {first_line(exc)}") from exc


def refuse_foreign_code(folder: Path) -> None:
    """Refuse a folder whose ``config.json`` or ``tokenizer_config.json`` names code (``auto_map``)
    other than what export writes: the library loads exported folders with its own classes and
    never runs a folder's code (nor asks whether to: transformers would prompt on standard input)."""
    from bytestream.stream_tokenizer import auto_map as stream_auto_map

    known = {"config.json": known_auto_maps(), "tokenizer_config.json": [None, stream_auto_map()]}
    for name, recognised in known.items():
        try:
            saved = json.loads((Path(folder) / name).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # missing or corrupt: the loading below names it
        named = saved.get("auto_map") if isinstance(saved, dict) else None
        if named not in recognised:
            shown = json.dumps(named, ensure_ascii=True)
            raise UserError(
                f"{Path(folder) / name} names code of its own that bytedistill does not know (auto_map "
                f"{shown[:120]}): bytedistill runs no code from a model folder; export the student again"
            )


def _from_pretrained(folder: Path, **options):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise UserError(f"{folder} is not an exported model folder (no config.json)")
    refuse_foreign_code(folder)
    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    register_auto_classes()  # every architecture loads with this library's class, never the folder's code
    hf_logging.set_verbosity_error()  # its load report would print a table above our one line
    if options.get("device_map") == "meta":
        hf_logging.disable_progress_bar()  # the check reads no tensor: no "Loading weights" bar
    try:
        model, info = AutoModelForCausalLM.from_pretrained(  # never the folder's code: the library's own classes
            folder,
            output_loading_info=True,
            ignore_mismatched_sizes=True,
            trust_remote_code=False,
            use_kernels=False,  # the layers as trained, on every device: no kernels from the Hub
            **options,
        )
    except Exception as exc:  # json, safetensors and transformers each raise their own types for a corrupt file
        raise UserError(f"{folder} does not load as a model: {first_line(exc)}") from exc
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    problems = [
        f"{label} {', '.join(sorted(_tensor_name(key) for key in info[field])[:3])}"
        for field, label in WEIGHT_PROBLEMS.items()
        if info.get(field)
    ]
    if problems:
        raise UserError(f"{folder}: the weights do not match config.json ({'; '.join(problems)})")
    return model


def _saved_tokenizer_config(folder: Path) -> dict:
    try:
        saved = json.loads((Path(folder) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # missing or corrupt: folders exported before either stream was named
    return saved if isinstance(saved, dict) else {}


def saved_byte_stream(folder: Path) -> str:
    """The stream the folder's ``tokenizer_config.json`` names (``byte_stream``; absent: ``eot``)."""
    return _saved_tokenizer_config(folder).get("byte_stream") or "eot"


CHAT_TEMPLATE_FILE = "chat_template.jinja"


def saved_chat(folder: Path) -> dict:
    """A chat student's tokenizer settings as its folder holds them (its reserved symbols, the texts its
    chat template is rendered with, its template); none for a plain student."""
    saved = _saved_tokenizer_config(folder)
    if not saved.get("reserved_symbols"):
        return {}
    chat = {key: saved.get(key) for key in ("reserved_symbols", "chat_template_tokens", "chat_prefix")}
    if "end_of_turn" in saved:  # recorded by the training store (folders exported before it: the name rule)
        chat["end_of_turn"] = saved["end_of_turn"]
    template = Path(folder) / CHAT_TEMPLATE_FILE
    if template.is_file():
        chat["chat_template"] = template.read_text(encoding="utf-8")
    elif saved.get("chat_template"):
        chat["chat_template"] = saved["chat_template"]
    return chat


def folder_stream(folder: Path) -> StreamKind | None:
    """The stream the folder's student reads, as its ``config.json`` says (None: no readable config)."""
    try:
        return StreamKind.of_config(json.loads((Path(folder) / "config.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, AttributeError):
        return None  # missing or corrupt: the model's loading names it


def load_stream_tokenizer(folder: Path) -> ByteStreamTokenizer | BytesTokenizer:
    """The folder's tokenizer as the library uses it: a bytes student's stock byte tokenizer
    (:class:`BytesTokenizer`), else its stream tokenizer, in the stream its ``tokenizer_config.json``
    names (this library's own class, no remote code run)."""
    if folder_stream(folder) is StreamKind.BYTES:
        return BytesTokenizer.from_folder(Path(folder))
    path = Path(folder) / TEACHER_TOKENIZER_FILE
    if not path.is_file():
        raise UserError(f"{folder} has no {TEACHER_TOKENIZER_FILE}: export it again with this version of bytedistill")
    try:
        return ByteStreamTokenizer(
            teacher_tokenizer_file=str(path), byte_stream=saved_byte_stream(folder), **saved_chat(folder)
        )
    except Exception as exc:  # the tokenizers library raises a bare Exception for a corrupt file
        raise UserError(f"{path} is not a teacher tokenizer the stream tokenizer reads: {first_line(exc)}") from exc


def require_same_stream(model, tokenizer: ByteStreamTokenizer | BytesTokenizer) -> StreamKind:
    """The stream the student reads, which its stream tokenizer must write (a mismatch is one line)."""
    stream = StreamKind.of_config(model.config)
    if tokenizer.byte_stream != stream.value:
        raise UserError(
            f"the student reads the {stream.shown} stream but its stream tokenizer writes the "
            f"{StreamKind(tokenizer.byte_stream).shown} stream: export the student again"
        )
    return stream
