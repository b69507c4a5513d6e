"""The student's byte tokenizer: every byte is one id (its value) plus the four specials.

Built with the ``tokenizers`` library (a ByteLevel pre-tokenizer and decoder over a BPE model
whose vocabulary is the 256 GPT-2 byte characters in byte order and which has no merges), and
wrapped as a stock :class:`transformers.PreTrainedTokenizerFast`, so
``AutoTokenizer.from_pretrained(folder)`` loads a saved copy with no ``trust_remote_code``. An
exported folder's ``tokenizer_config.json`` names the stream tokenizer instead (so that
``AutoTokenizer`` without remote code refuses rather than placing no ``<eot>``): there this one
loads by name, ``PreTrainedTokenizerFast.from_pretrained(folder)``.

- ``tokenizer("héllo").input_ids`` is ``[<bos>] + list("héllo".encode())`` (``add_special_tokens``
  adds ``<bos>`` = 257 in front; pass ``add_special_tokens=False`` for the bare bytes).
- ``tokenizer.decode(ids, skip_special_tokens=True)`` drops ``<eot>``/``<bos>``/``<eos>``/``<pad>``
  and gives back the text exactly when the bytes are valid UTF-8.
- Invalid UTF-8 (a model can emit any byte sequence, e.g. half a character) cannot be a ``str``:
  ``decode`` replaces each invalid sequence with U+FFFD (``�``), like ``bytes.decode(errors="replace")``.
  Use :func:`decode_bytes` for the exact bytes.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from bytestream.alphabet import BOS, EOS, EOT, NUM_BYTES, PAD, SPECIAL_NAMES
from bytestream.vocab import gpt2_unicode_to_byte


def decode_bytes(ids: Iterable[int]) -> bytes:
    """The exact bytes of a symbol sequence: byte symbols kept, the specials dropped."""
    return bytes(int(i) for i in ids if 0 <= int(i) < NUM_BYTES)


def build_backend() -> Tokenizer:
    """The ``tokenizers`` object: byte ids 0–255 and specials 256–259."""
    tokenizer = Tokenizer(models.BPE(vocab=gpt2_unicode_to_byte(), merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([SPECIAL_NAMES[i] for i in (EOT, BOS, EOS, PAD)])
    bos = SPECIAL_NAMES[BOS]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, BOS)]
    )
    return tokenizer


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The byte tokenizer as a ``transformers`` fast tokenizer (save it with ``save_pretrained``)."""
    backend = build_backend()
    for symbol, name in SPECIAL_NAMES.items():
        assert backend.token_to_id(name) == symbol, f"{name} must have id {symbol}"
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=SPECIAL_NAMES[BOS],
        eos_token=SPECIAL_NAMES[EOS],
        pad_token=SPECIAL_NAMES[PAD],
        additional_special_tokens=[SPECIAL_NAMES[EOT]],
        clean_up_tokenization_spaces=False,
        split_special_tokens=True,  # the text "<eot>" is five bytes, never the special symbol
        model_input_names=["input_ids", "attention_mask"],
    )
