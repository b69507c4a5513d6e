"""A bytes student's tokenizer (docs/DESIGN.md, "The bytes stream"): the stock byte tokenizer of
:mod:`bytestream.byte_tokenizer` as a ``transformers`` ``PreTrainedTokenizerFast``, which the exported
folder ships and ``AutoTokenizer.from_pretrained(folder)`` loads with no code of ours; and
:class:`BytesTokenizer`, what the library's commands (``generate``, ``chat``, ``score``, ``serve``) ask of
a student's tokenizer, over the folder's own.

- ``tokenizer(text)`` is ``<bos>`` + the text's UTF-8 bytes (``add_special_tokens=False``: the bytes
  alone); a plain student's tokenizer reads the text ``<eos>`` as five bytes, a chat student's reads its
  chat template's specials (``<|im_start|>`` …) as their symbols, as every chat tokenizer does.
- ``decode`` gives back the text; bytes that are not valid UTF-8 decode to U+FFFD, one per invalid sequence.
- A chat student's template is the teacher's, rendered with the teacher's own special-token texts and
  opened by ``<bos>`` in place of the teacher's document prefix: the stream the student was trained on.
"""

from __future__ import annotations

import json
from pathlib import Path

from bytestream.alphabet import BYTES_SPECIAL_NAMES
from bytestream.byte_tokenizer import byte_tokenizer
from bytestream.stream_kind import StreamKind
from common.errors import UserError, first_line

BYTES = StreamKind.BYTES
BOS_NAME, EOS_NAME, PAD_NAME = (BYTES_SPECIAL_NAMES[s] for s in (BYTES.bos, BYTES.eos, BYTES.pad))


def plain_tokenizer(reserved: list[str] | tuple[str, ...] = (), chat_template: str | None = None):
    """The folder's tokenizer: bytes 0–255, ``<bos>``, ``<eos>``, ``<pad>``, then the ``reserved`` symbols;
    ``<bos>`` opens every encoded text; batches pad on the left (prompts for ``generate``)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    backend = byte_tokenizer(reserved)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS_NAME} $A", pair=f"{BOS_NAME} $A $B", special_tokens=[(BOS_NAME, BYTES.bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_NAME,
        eos_token=EOS_NAME,
        pad_token=PAD_NAME,
        additional_special_tokens=list(reserved),
        clean_up_tokenization_spaces=False,
        split_special_tokens=not reserved,  # plain text: "<eos>" is five bytes; a chat template's specials are symbols
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
        **({"chat_template": chat_template} if chat_template else {}),
    )


def bytes_chat_template(template: str, template_tokens: dict[str, str], prefix: str) -> str:
    """The teacher's chat template for the stock tokenizer: it writes ``<bos>`` first, then renders as the
    teacher does, each special-token variable (``bos_token`` …) set to the teacher's own text, the one
    that is the teacher's document prefix (the stream's ``<bos>``, already written) set empty."""
    sets = "".join(
        f"{{%- set {name} = {json.dumps('' if prefix and text == prefix else text)} -%}}"
        for name, text in sorted(template_tokens.items())
    )
    return f"{sets}{{{{- {json.dumps(BOS_NAME)} -}}}}{template}"


class BytesTokenizer:
    """A bytes student's tokenizer as the library's commands use it: prompts are ``<bos>`` + their bytes
    (no token end to place, so nothing to heal: the open word is always empty), texts are read whole,
    conversations through the folder's chat template."""

    byte_stream = BYTES.value
    stream = BYTES

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer  # the folder's PreTrainedTokenizerFast
        # the reserved symbols: the tokens after the bytes stream's own, in symbol order
        self.reserved_symbols = tokenizer.convert_ids_to_tokens(list(range(BYTES.alphabet_size, len(tokenizer))))
        self.chat_template = tokenizer.chat_template

    @classmethod
    def from_folder(cls, folder: Path) -> BytesTokenizer:
        from transformers import PreTrainedTokenizerFast

        try:
            return cls(PreTrainedTokenizerFast.from_pretrained(folder))
        except Exception as exc:  # tokenizers and transformers raise their own types for a corrupt file
            raise UserError(f"{folder}: its byte tokenizer does not load: {first_line(exc)}") from exc

    def encode_bytes(self, data: bytes, *, bos: bool = True, eos: bool = False) -> list[int]:
        """The stream of raw document bytes (any bytes, not only valid UTF-8)."""
        return [*([BYTES.bos] if bos else []), *data, *([BYTES.eos] if eos else [])]

    def encode_prompt(self, data: bytes, max_open: int | None = None) -> tuple[list[int], bytes]:
        """A prompt's stream, whole: a cut inside a word needs no healing in a stream with no token ends."""
        return self.encode_bytes(data), b""

    def text_bytes(self, ids) -> bytes:
        return BYTES.text_bytes(int(i) for i in ids)

    def apply_chat_template(self, conversation, **kwargs):
        return self.tokenizer.apply_chat_template(conversation, **kwargs)

    def chat_template_variables(self) -> dict[str, str]:
        """The special-token texts the folder's ``apply_chat_template`` renders its template with."""
        return dict(self.tokenizer.special_tokens_map)

    def encode_chat(self, text: str) -> list[int]:
        """A conversation rendered by the folder's template as the student's stream, as the folder's
        ``apply_chat_template`` reads its rendering (``<bos>`` is the template's)."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]
