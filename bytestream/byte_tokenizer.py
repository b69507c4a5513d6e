"""The stock byte tokenizer of a tokenizer-free student (docs/DESIGN.md, "The bytes stream").

A `tokenizers` byte-level model with no merges: text byte ``b`` is token ``b``, so any text
round-trips exactly; the specials (``<bos>``, ``<eos>``, ``<pad>``, a chat store's reserved
symbols) follow as added tokens, in symbol order. Loading it needs no code of ours: it is a plain
``tokenizer.json`` for ``PreTrainedTokenizerFast``.
"""

from __future__ import annotations

from functools import lru_cache

from bytestream.alphabet import BYTES_SPECIAL_NAMES, NUM_BYTES


@lru_cache(maxsize=1)
def byte_level_chars() -> tuple[str, ...]:
    """The printable character that stands for each byte in a byte-level vocabulary (GPT-2's
    mapping, as `tokenizers`' ``ByteLevel.alphabet()`` lists it), indexed by the byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {}
    shifted = 0
    for byte in range(NUM_BYTES):
        if byte in printable:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(NUM_BYTES + shifted)
            shifted += 1
    return tuple(chars[byte] for byte in range(NUM_BYTES))


def byte_special_names(reserved: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The names of the bytes stream's specials in symbol order: ``<bos>``, ``<eos>``, ``<pad>``,
    then the reserved symbols (a chat store's, by their teacher texts)."""
    return [*(BYTES_SPECIAL_NAMES[symbol] for symbol in sorted(BYTES_SPECIAL_NAMES)), *reserved]


def byte_tokenizer(reserved: tuple[str, ...] | list[str] = ()):
    """A `tokenizers.Tokenizer` with one token per byte (ids 0..255) and the specials after them."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {char: byte for byte, char in enumerate(byte_level_chars())}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(byte_special_names(reserved))
    return tokenizer
