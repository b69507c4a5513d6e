"""Tiny random bytes students saved as their exported folders are: a stock ``LlamaForCausalLM``
over the 256 bytes and the specials, its tokenizer from :func:`bytestream.byte_tokenizer.byte_tokenizer`
(``<bos>`` put before a text), and for a chat student a ChatML template and an end-of-turn symbol
the generation config stops at."""

from __future__ import annotations

from pathlib import Path

from bytestream.alphabet import BYTES_BOS, BYTES_EOS, BYTES_PAD

CHAT_RESERVED = ("<|im_start|>", "<|im_end|>")
END_OF_TURN = BYTES_PAD + 1 + CHAT_RESERVED.index("<|im_end|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Weights this much larger than transformers' default initialisation give logits spread enough
# that greedy decoding wanders over many bytes instead of repeating one.
INIT_SCALE = 0.2


def tiny_llama(vocab_size: int, *, tied: bool, seed: int):
    """A random 2-layer Llama with grouped-query attention (4 heads, 2 key/value heads)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
        initializer_range=INIT_SCALE,
        bos_token_id=BYTES_BOS,
        eos_token_id=BYTES_EOS,
        pad_token_id=BYTES_PAD,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def student_tokenizer(reserved: tuple[str, ...] = (), chat_template: str | None = None):
    """The stock byte tokenizer as a ``PreTrainedTokenizerFast`` that puts ``<bos>`` before a text."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    from bytestream.byte_tokenizer import byte_tokenizer

    tokenizer = byte_tokenizer(reserved)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", BYTES_BOS)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<bos>",
        eos_token="<eos>",
        pad_token="<pad>",
        additional_special_tokens=list(reserved),
        chat_template=chat_template,
    )


def save_plain_student(folder: Path, seed: int = 0) -> Path:
    """A plain bytes student (tied embeddings) in ``folder``."""
    model = tiny_llama(BYTES_PAD + 1, tied=True, seed=seed)
    model.save_pretrained(folder)
    student_tokenizer().save_pretrained(folder)
    return folder


def save_chat_student(folder: Path, stop_byte: int | None = None, seed: int = 1) -> Path:
    """A chat bytes student (untied embeddings) in ``folder``. Its end-of-turn row is zero (greedy
    decoding never ends a turn) or, with ``stop_byte``, that byte's row made a little larger (greedy
    decoding ends the turn where it would have written that byte)."""
    import torch
    from transformers import GenerationConfig

    model = tiny_llama(BYTES_PAD + 1 + len(CHAT_RESERVED), tied=False, seed=seed)
    with torch.no_grad():
        row = model.lm_head.weight[END_OF_TURN]
        row.copy_(torch.zeros_like(row) if stop_byte is None else 1.02 * model.lm_head.weight[stop_byte])
    model.save_pretrained(folder)
    student_tokenizer(CHAT_RESERVED, CHAT_TEMPLATE).save_pretrained(folder)
    GenerationConfig(
        bos_token_id=BYTES_BOS, eos_token_id=[BYTES_EOS, END_OF_TURN], pad_token_id=BYTES_PAD
    ).save_pretrained(folder)
    return folder
