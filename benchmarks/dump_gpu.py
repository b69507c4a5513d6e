"""Dump cost on a GPU: a randomly initialised Llama-3-8B-shaped teacher in bfloat16 on random token
ids over the real Llama-3 vocabulary, timing the teacher forward against the conversion on the
device plus the store (encoding + writing). Goal: conversion + store ≤ 5% of the total.

    python -m benchmarks.dump_gpu --shape 8b --device cuda      # on a lent GPU machine
    python -m benchmarks.dump_gpu --shape tiny --device cpu     # smoke test anywhere

It uses the dump's own pieces (``Teacher.logits`` with the permuted output layer,
``Converter.convert_torch(columns="sorted")``, ``StoreWriter``), one document per sequence.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.common import llama3_tokenizer_json
from distill.convert import Converter
from distill.teacher import Teacher
from distill.vocab import load_teacher_tokenizer, vocab_from_tokenizer
from logit_store.store import StoreWriter

SHAPES = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--shape", choices=list(SHAPES), default="8b", help="teacher shape")
    parser.add_argument("--device", default="cuda", help="torch device")
    parser.add_argument("--batch", type=int, default=8, help="documents per forward batch")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens per document")
    parser.add_argument("--batches", type=int, default=4, help="timed batches (one more is run as warm-up)")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    tokenizer = load_teacher_tokenizer(llama3_tokenizer_json())
    vocab = vocab_from_tokenizer(tokenizer, name="llama3")
    converter = Converter(vocab)
    config = LlamaConfig(vocab_size=vocab.size, max_position_embeddings=8192, tie_word_embeddings=False, **SHAPES[args.shape])
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    teacher = Teacher(model, model.get_output_embeddings(), tokenizer, vocab, name=f"random-llama3-{args.shape}", device=device, dtype=dtype)
    teacher.permute_output(converter.column_order)

    rng = np.random.default_rng(0)
    regular = vocab.regular_ids
    forward = convert_store = 0.0
    tokens = 0
    with tempfile.TemporaryDirectory() as tmp, StoreWriter(tmp, vocab, teacher=teacher.name, trie=converter.trie) as writer:
        for step in range(args.batches + 1):
            ids = rng.choice(regular, size=(args.batch, args.tokens))
            inputs = np.concatenate([np.full((args.batch, 1), vocab.prefix_ids[0]), ids], axis=1)
            synchronize(device)
            start = time.perf_counter()
            rows = [np.arange(args.tokens + 1)] * args.batch
            logits = teacher.logits(torch.from_numpy(inputs).to(device), torch.ones(inputs.shape, dtype=torch.long, device=device), rows)
            synchronize(device)
            middle = time.perf_counter()
            for b in range(args.batch):
                dist = converter.convert_torch(ids[b], logits[b * (args.tokens + 1) : (b + 1) * (args.tokens + 1)], columns="sorted")
                writer.add_distributions(dist, token_ids=ids[b])
            synchronize(device)
            end = time.perf_counter()
            if step > 0:  # the first batch warms up kernels and caches
                forward += middle - start
                convert_store += end - middle
                tokens += args.batch * args.tokens
    total = forward + convert_store
    print(f"random Llama-3 {args.shape} teacher, {dtype}, {device}; {args.batches} batches of {args.batch} x {args.tokens} tokens")
    print(f"{'teacher forward':<32}{forward:>9.2f} s")
    print(f"{'conversion + store':<32}{convert_store:>9.2f} s")
    print(f"{'tokens/s (both)':<32}{tokens / total:>11,.0f}")
    print(f"share conversion + store = {convert_store / total:.1%} (goal <= 5%)")


if __name__ == "__main__":
    main()
