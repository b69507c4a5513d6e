"""GGUF export of a bytes student, for stock llama.cpp (docs/DESIGN.md, "GGUF export").

A bytes student's folder is a plain ``transformers`` Llama whose vocabulary is the 256 bytes
(id ``b`` is byte ``b``) and the specials after them. :func:`export_gguf` writes it as a GGUF of
architecture ``llama`` with the ``gguf`` package: the weights under llama.cpp's tensor names (q and
k rows reordered for its rotary layout), and a tokenizer that llama.cpp's own code runs so that
text byte ``b`` becomes token ``b``: a GPT-2-style byte-level BPE whose tokens are the 256
byte-level characters and which has no merge that can ever apply, the specials as control tokens.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from bytestream.alphabet import BYTES_SPECIAL_NAMES, NUM_BYTES
from bytestream.byte_tokenizer import byte_level_chars
from common.errors import UserError
from students.models.flat import FLAT

GGUF_TYPES = ("f32", "f16", "q8_0")

# Text the folder's own tokenizer must read as one token per byte: spaces, a newline and a tab,
# two- three- and four-byte UTF-8.
PROBE_TEXT = "Hi  there,\n\twörld ✓ 🙂."

# llama.cpp refuses a GPT-2 vocabulary without merges, so one is written that can never apply:
# BPE starts from single characters and the specials are cut out before it, so a pair of these
# multi-character names never meets.
INERT_MERGE = f"{BYTES_SPECIAL_NAMES[min(BYTES_SPECIAL_NAMES)]} {BYTES_SPECIAL_NAMES[max(BYTES_SPECIAL_NAMES)]}"

# With no merges any pre-tokenizer split gives the same tokens; this one is a plain split whose
# detokenizer keeps the spaces before punctuation (the default GPT-2 one removes them).
PRE_TOKENIZER = "qwen2"


@dataclass(frozen=True)
class ByteVocab:
    """The tokenizer metadata of a bytes student, as the GGUF holds it."""

    tokens: list[str]  # one per model row: the byte-level characters, then the specials' names
    types: list[int]  # each token's GGUF type: a byte is normal, a special a control token
    bos: int
    eos: int
    pad: int
    eot: int | None  # a chat student's end-of-turn symbol
    add_bos: bool  # whether the student's tokenizer puts <bos> before a text
    chat_template: str | None


def export_gguf(folder: Path, out: Path, gguf_type: str = "f32") -> Path:
    """Write the bytes student in ``folder`` as the GGUF file ``out`` (``f32``, ``f16`` or ``q8_0``
    weights); a temporary file beside ``out`` is renamed to it when it is whole."""
    folder, out = Path(folder), Path(out)
    if gguf_type not in GGUF_TYPES:
        raise UserError(f"unknown GGUF type {gguf_type!r}; choose one of {', '.join(GGUF_TYPES)}")
    if not (folder / "config.json").is_file():
        raise UserError(f"{folder} is not a model folder (no config.json)")
    refuse_shipped_code(folder)
    require_gguf()
    config = llama_config(folder)
    vocab = byte_vocab(folder, config.vocab_size)
    tensors = gguf_tensors(folder, config, gguf_type)
    if not out.parent.is_dir():
        raise UserError(f"{out.parent} is not a folder")
    partial = out.parent / f".{out.name}.{os.getpid()}.partial"  # this process's own name beside the output
    try:
        write_gguf(partial, config, vocab, tensors, gguf_type, name=folder.resolve().name)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def refuse_shipped_code(folder: Path) -> None:
    """Refuse a folder whose model or tokenizer is a class it ships (``auto_map``): a fused, an
    ``<eot>`` or a patched student, which need code of ours to read a prompt."""
    for name in ["config.json", "tokenizer_config.json"]:
        path = folder / name
        if path.is_file() and "auto_map" in json.loads(path.read_text()):
            raise UserError(
                f"{folder}: its {name} names code the folder ships (auto_map); GGUF export takes a bytes student, "
                "whose model and tokenizer are stock"
            )


def require_gguf() -> None:
    """The ``gguf`` package, or a one-line refusal saying how to install it."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise UserError("GGUF export needs the gguf package: pip install 'bytedistill[gguf]'") from None


def llama_config(folder: Path):
    """The folder's :class:`LlamaConfig`, refused in one line where llama.cpp's ``llama`` would
    compute something else (another model type, scaled rotary positions, biases)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(folder)
    if config.model_type != FLAT.model_type:  # llama.cpp's "llama" architecture
        raise UserError(f"{folder} holds a {config.model_type!r} model; GGUF export takes a flat (Llama) bytes student")
    rope = rope_parameters(config)
    if rope.get("rope_type", "default") != "default":
        raise UserError(f"{folder}: rotary scaling {rope['rope_type']!r} is not supported by the GGUF export")
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        raise UserError(f"{folder}: a Llama with biases is not supported by the GGUF export")
    return config


def rope_parameters(config) -> dict:
    """The rotary settings, whichever way the config's ``transformers`` version spells them."""
    return dict(getattr(config, "rope_parameters", None) or {"rope_theta": getattr(config, "rope_theta", 10000.0)})


def byte_vocab(folder: Path, vocab_size: int) -> ByteVocab:
    """The folder's tokenizer as GGUF metadata, refused in one line unless it reads each byte as
    the token of that id, names the bytes stream's specials and has one id per model row."""
    from gguf import TokenType
    from transformers import AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer(PROBE_TEXT, add_special_tokens=False)["input_ids"] != list(PROBE_TEXT.encode()):
        raise UserError(f"{folder}: its tokenizer does not read one token per byte; GGUF export takes a bytes student")
    names = tokenizer.convert_ids_to_tokens(list(range(NUM_BYTES, len(tokenizer))))
    specials = {name: NUM_BYTES + i for i, name in enumerate(names)}
    missing = [name for name in BYTES_SPECIAL_NAMES.values() if name not in specials]
    if missing:
        raise UserError(f"{folder}: its tokenizer lacks the bytes stream's {', '.join(missing)}")
    if len(tokenizer) != vocab_size:
        raise UserError(f"{folder}: its tokenizer has {len(tokenizer)} ids but the model {vocab_size} rows")
    bos, eos, pad = (specials[BYTES_SPECIAL_NAMES[symbol]] for symbol in sorted(BYTES_SPECIAL_NAMES))
    return ByteVocab(
        tokens=[*byte_level_chars(), *names],
        types=[TokenType.NORMAL] * NUM_BYTES + [TokenType.CONTROL] * len(names),
        bos=bos,
        eos=eos,
        pad=pad,
        eot=end_of_turn(folder, GenerationConfig, eos),
        add_bos=tokenizer("a")["input_ids"][0] == bos,
        chat_template=tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None,
    )


def end_of_turn(folder: Path, generation_config_class, eos: int) -> int | None:
    """The first id the generation config stops at that is not ``<eos>``: a chat student's end of turn."""
    if not (folder / "generation_config.json").is_file():
        return None
    stops = generation_config_class.from_pretrained(folder).eos_token_id
    stops = stops if isinstance(stops, list) else [stops]
    return next((stop for stop in stops if stop is not None and stop != eos), None)


def permute_for_rope(weight, heads: int):
    """Reorder a q or k projection's rows from the halves layout of ``transformers``' rotary
    embedding to the interleaved pairs of llama.cpp's ``llama`` (what its converter does)."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def read_weights(folder: Path) -> dict:
    """Every tensor of the folder's safetensors files, as float32 numpy arrays."""
    from safetensors import safe_open

    files = sorted(folder.glob("model*.safetensors"))
    if not files:
        raise UserError(f"{folder} has no model.safetensors")
    weights = {}
    for path in files:
        with safe_open(path, framework="pt") as file:
            weights.update({key: file.get_tensor(key).float().numpy() for key in list(file.keys())})
    return weights


def gguf_tensors(folder: Path, config, gguf_type: str) -> dict:
    """GGUF name -> (data, its GGML type or None for a plain float array), in the folder's order."""
    import gguf

    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads or config.num_attention_heads
    tensors = {}
    for key, weight in read_weights(folder).items():
        if key == "lm_head.weight" and config.tie_word_embeddings:
            continue  # llama.cpp reads a missing output.weight as the embedding
        name = name_map.get_name(key, try_suffixes=(".weight",))
        if name is None:
            raise UserError(f"{folder}: tensor {key} has no place in a GGUF Llama")
        if key.endswith("q_proj.weight"):
            weight = permute_for_rope(weight, heads)
        elif key.endswith("k_proj.weight"):
            weight = permute_for_rope(weight, kv_heads)
        tensors[name] = stored_tensor(weight, gguf_type)
    if not config.tie_word_embeddings and "output.weight" not in tensors:
        raise UserError(f"{folder}: untied embeddings but no lm_head.weight")
    return tensors


def stored_tensor(weight, gguf_type: str):
    """A weight as the GGUF stores it: norms (vectors) always float32; matrices in ``gguf_type``,
    with a matrix whose rows do not split into Q8_0 blocks kept as float16."""
    import gguf
    import numpy as np

    if weight.ndim == 1 or gguf_type == "f32":
        return weight.astype(np.float32), None
    q8_block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0][0]
    if gguf_type == "q8_0" and weight.shape[-1] % q8_block == 0:
        return gguf.quants.quantize(weight, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    return weight.astype(np.float16), None


def write_gguf(path: Path, config, vocab: ByteVocab, tensors: dict, gguf_type: str, name: str) -> None:
    """Write the header, the metadata and the tensors to ``path``."""
    import gguf

    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    write_model_metadata(writer, config, gguf_type, name)
    write_tokenizer_metadata(writer, vocab)
    for tensor_name, (data, raw_dtype) in tensors.items():
        writer.add_tensor(tensor_name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_model_metadata(writer, config, gguf_type: str, name: str) -> None:
    """The ``llama`` hyperparameters llama.cpp reads."""
    import gguf

    file_types = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_name(name)
    writer.add_file_type(file_types[gguf_type])
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads or config.num_attention_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(rope_parameters(config)["rope_theta"]))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)


def write_tokenizer_metadata(writer, vocab: ByteVocab) -> None:
    """The byte tokenizer as llama.cpp's GPT-2 BPE reads it, with the specials and the chat template."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(PRE_TOKENIZER)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges([INERT_MERGE])
    writer.add_bos_token_id(vocab.bos)
    writer.add_eos_token_id(vocab.eos)
    writer.add_pad_token_id(vocab.pad)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(False)
    if vocab.eot is not None:
        writer.add_eot_token_id(vocab.eot)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)
