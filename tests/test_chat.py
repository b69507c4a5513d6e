"""Conversations read as the teacher reads them (docs/DESIGN.md, "Conversations"): the ids its own
chat template gives, the roles at exact byte offsets of the rendering, the roles of each stream
target, and malformed conversations refused in one line."""

from __future__ import annotations

import numpy as np
import pytest

from bytestream.stream_kind import StreamKind
from bytestream.trie import build_trie
from common.errors import UserError
from distill.corpus.conversations import ConversationFields, conversation_document
from distill.teacher.chat import ChatEncoder, ChatTemplate, MalformedConversation
from tests.chat_families import llama3_family, llama3_template, mistral_family, smollm2_family
from tests.gguf_teachers import write_tiny_gguf
from tests.teachers import mistral_sentencepiece_folder

SYSTEM = "Réponds en une phrase."
CHAT = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "Où est 東京?"},
    {"role": "assistant", "content": "Au Japon — 日本."},
    {"role": "user", "content": "Et Zürich? 🇨🇭"},
    {"role": "assistant", "content": "En Suisse."},
]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return smollm2_family(write_tiny_gguf(tmp_path_factory.mktemp("chat") / "tiny.gguf", chat_template=True))


@pytest.fixture(scope="module")
def mistral(tmp_path_factory):
    return mistral_family(mistral_sentencepiece_folder(tmp_path_factory.mktemp("chat-v3") / "v3", "v3"))


@pytest.fixture(scope="module")
def llama3(llama3_tokenizer, llama3_vocab, llama3_converter):
    return llama3_family(llama3_tokenizer, llama3_vocab, llama3_converter.trie)


def runs(document) -> list[tuple[int, int, int]]:
    """(start, end, role) of every run of one role over the rendering's bytes."""
    ends = [*document.role_starts.tolist()[1:], len(document.text)]
    return [(s, e, r) for s, e, r in zip(document.role_starts.tolist(), ends, document.role_values.tolist()) if e > s]


def expected_runs(pieces: list[tuple[str, int]]) -> tuple[bytes, list[tuple[int, int, int]]]:
    """The rendering written out by hand as (text, role) pieces: its bytes and its runs."""
    text, out, at = b"", [], 0
    for piece, role in pieces:
        data = piece.encode()
        if out and out[-1][2] == role:
            out[-1] = (out[-1][0], at + len(data), role)
        else:
            out.append((at, at + len(data), role))
        text, at = text + data, at + len(data)
    return text, out


def test_smollm2_roles_are_byte_exact(smollm2):
    document = smollm2.chat.encode(conversation_document(CHAT))
    text, want = expected_runs(
        [
            ("<|im_start|>system\n", 0),
            (SYSTEM, 1),
            ("<|im_end|>\n<|im_start|>user\n", 0),
            ("Où est 東京?", 2),
            ("<|im_end|>\n<|im_start|>assistant\n", 0),
            ("Au Japon — 日本.<|im_end|>", 3),  # the end of turn is the assistant's: the student learns to stop
            ("\n<|im_start|>user\n", 0),
            ("Et Zürich? 🇨🇭", 2),
            ("<|im_end|>\n<|im_start|>assistant\n", 0),
            ("En Suisse.<|im_end|>", 3),
            ("\n", 0),
        ]
    )
    assert document.text == text
    assert runs(document) == want


@pytest.mark.slow  # the Llama-3 vocabulary's tables
def test_llama3_roles_are_byte_exact_and_its_bos_is_context(llama3):
    chat = [*CHAT[:1], {"role": "user", "content": "  Où est 東京?\n"}, *CHAT[2:]]  # the template trims content
    document = llama3.chat.encode(conversation_document(chat))
    header = "<|start_header_id|>{}<|end_header_id|>\n\n"
    text, want = expected_runs(
        [
            (header.format("system"), 0),
            (SYSTEM, 1),
            ("<|eot_id|>" + header.format("user"), 0),
            ("Où est 東京?", 2),
            ("<|eot_id|>" + header.format("assistant"), 0),
            ("Au Japon — 日本.<|eot_id|>", 3),
            (header.format("user"), 0),
            ("Et Zürich? 🇨🇭", 2),
            ("<|eot_id|>" + header.format("assistant"), 0),
            ("En Suisse.<|eot_id|>", 3),
        ]
    )
    assert document.text == text  # <|begin_of_text|> is the teacher's context prefix, read before every document
    assert runs(document) == want
    assert document.token_ids[0] == 128006 and 128000 not in document.token_ids.tolist()
    vocab = llama3.vocab  # <|eot_id|> is an end-of-text name: kept, it is a symbol, not <eos>
    assert vocab.end_of_text_ids == (128001,) and vocab.kept_ids == (128006, 128007, 128009)


def test_ids_are_those_the_teacher_sees_in_use(smollm2):
    """Without a special's text in a message, the ids are the tokenizer's own apply_chat_template
    ids (less the context prefix); with one, that text stays text."""
    ids = smollm2.chat.encode(conversation_document(CHAT)).token_ids.tolist()
    assert ids == smollm2.tokenizer.apply_chat_template(CHAT, tokenize=True)["input_ids"]
    prompt = smollm2.chat.prompt_ids(CHAT[:2]).tolist()
    assert (
        prompt
        == smollm2.tokenizer.apply_chat_template(CHAT[:2], tokenize=True, add_generation_prompt=True)["input_ids"]
    )
    literal = [{"role": "user", "content": "say <|im_end|> and <|im_start|>"}]
    ids = smollm2.chat.encode(conversation_document(literal)).token_ids.tolist()
    assert ids.count(1) == 2 and ids.count(2) == 2  # the template's own (its default system turn's, the user's)


@pytest.mark.slow  # the Llama-3 vocabulary's tables
def test_llama3_ids_match_its_tokenizer(llama3, llama3_tokenizer_path):
    from tests.teachers import llama3_tokenizer_with_bos

    tokenizer = llama3_tokenizer_with_bos(llama3_tokenizer_path)
    want = tokenizer.apply_chat_template(CHAT, tokenize=True, chat_template=llama3_template().source)["input_ids"]
    assert [128000, *llama3.chat.encode(conversation_document(CHAT)).token_ids.tolist()] == want


@pytest.mark.parametrize("stream", StreamKind.stored_kinds(), ids=lambda s: s.value)
def test_target_roles_follow_the_rendering(smollm2, stream):
    document = smollm2.chat.encode(conversation_document(CHAT))
    layout = stream.layout(smollm2.converter.trie, document.token_ids)
    roles = document.target_roles(layout.symbols, stream)
    assert len(roles) == layout.num_positions
    targets = layout.symbols[1:]
    im_start, im_end = stream.alphabet_size, stream.alphabet_size + 1
    assert set(roles[targets == im_start].tolist()) == {0}
    assert roles[targets == im_end].tolist() == [0, 0, 3, 0, 3]  # the system's, the users' and the assistant's ends
    assert roles[-1] == 0  # <eos>
    text = stream.text_bytes(targets[roles == 3])
    assert text == "Au Japon — 日本.En Suisse.".encode()
    assert stream.text_bytes(targets[roles == 2]) == "Où est 東京?Et Zürich? 🇨🇭".encode()
    if stream.eot is not None:  # an <eot> closes a token of its byte's speaker
        closes = np.flatnonzero(targets == stream.eot)
        assert (roles[closes] == roles[closes - 1]).all()


def test_mistral_reads_its_control_tokens_and_keeps_end_of_text(mistral):
    document = mistral.chat.encode(conversation_document(CHAT[1:3]))
    assert document.text == "<s>[INST] Où est 東京? [/INST]Au Japon — 日本.".encode()
    assert runs(document)[-1] == (len("<s>[INST] Où est 東京? [/INST]".encode()), len(document.text), 3)
    layout = StreamKind.FUSED.layout(mistral.converter.trie, document.token_ids)
    assert layout.symbols[-1] == StreamKind.FUSED.eos  # the final </s> is the stream's <eos>


MALFORMED = {
    "no role": ([{"content": "hi"}], "message 1 has no role"),
    "content not text": ([{"role": "user", "content": ["hi"]}], "message 1's content is list, not text"),
    "unknown role": (
        [{"role": "tool", "content": "{}"}],
        "message 1 has the role 'tool', not system, user or assistant",
    ),
    "no messages": ([], "a conversation needs a non-empty list of messages"),
}


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_conversations_are_refused_in_one_line(smollm2, name):
    messages, message = MALFORMED[name]
    with pytest.raises(MalformedConversation, match=message) as raised:
        smollm2.chat.encode(conversation_document(messages))
    assert "\n" not in str(raised.value)


def test_a_template_that_raises_or_is_not_prefix_stable(smollm2, mistral):
    with pytest.raises(MalformedConversation, match="the chat template refuses it: Conversation roles must alternate"):
        mistral.chat.encode(conversation_document(CHAT))  # its template raises on a system message
    with pytest.raises(MalformedConversation, match="'</s>' inside the conversation, which is not a reserved symbol"):
        mistral.chat.encode(conversation_document(CHAT[1:]))  # its end of text between turns
    unstable = ChatTemplate("{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m['content'] }}|{% endfor %}")
    chat = ChatEncoder(unstable, smollm2.chat.encoder, smollm2.chat.specials)
    with pytest.raises(MalformedConversation, match="not prefix-stable: message 2 changes how messages 1..1 render"):
        chat.encode(conversation_document(CHAT[1:3]))


def test_corpus_records_become_conversations():
    fields = ConversationFields()
    assert fields.document({"messages": CHAT[1:3]}, "x") == conversation_document(CHAT[1:3])
    pairs = ConversationFields(prompt="prompt")
    assert pairs.document({"prompt": "q", "response": "a"}, "x") == conversation_document(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    )
    assert pairs.document({"prompt": "q", "response": None}, "x") == conversation_document(
        [{"role": "user", "content": "q"}]
    )
    with pytest.raises(UserError, match="x: no field 'messages'"):
        fields.document({"text": "hi"}, "x")


def test_a_chat_vocabulary_keeps_its_ids_in_the_trie(smollm2):
    trie = build_trie(smollm2.vocab)
    assert trie.kept_ids == (1, 2) and trie.token_reserved[[1, 2, 0]].tolist() == [0, 1, -1]
