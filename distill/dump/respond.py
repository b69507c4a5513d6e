"""``dump --chat --respond``: the teacher writes the answers, and the dump distils its own answers
(sequence-level distillation; docs/DESIGN.md, "Conversations").

Every selected conversation gets its last assistant turn from the teacher: a conversation that ends
with a user message gets a new one, one that ends with an assistant message has it rewritten. The
prompt is the conversation rendered with the template's generation prompt, read as the dump reads
it; the teacher writes until a special that ends its turn (or any other special, or its end of
text), at most ``--respond-tokens`` tokens, greedily or sampled at ``--respond-temperature`` with a
seed per conversation (``--respond-seed`` plus its number), so answers do not depend on batching.
Bytes that are not UTF-8 (a cut character) are replaced by U+FFFD.

The answered conversations are kept beside the store as a corpus of messages, ``OUTPUT.answers.jsonl``
(one ``{"key", "messages"}`` per line, in corpus order; written whole under a temporary name, so it
exists only complete), and the dump reads that file. A rerun finds it and does not answer again.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

from common.errors import UserError
from distill.corpus.conversations import ConversationFields, conversation_document
from distill.corpus.spec import CorpusSpec, select_documents
from distill.teacher.chat import ChatEncoder, MalformedConversation, parse_conversation
from distill.teacher.encode import UnencodableDocument

ANSWERS_SUFFIX = ".answers.jsonl"


def answers_path(output: str | Path) -> Path:
    """Where the teacher's answers are kept: beside the store directory."""
    output = Path(output)
    return output.with_name(output.name + ANSWERS_SUFFIX)


def respond(
    chat: ChatEncoder,
    teacher,
    spec: CorpusSpec,
    output: str | Path,
    *,
    max_tokens: int,
    temperature: float,
    seed: int,
    progress: bool = True,
) -> CorpusSpec:
    """Write the answers file (unless it exists) and return the corpus that reads it."""
    path = answers_path(output)
    if not path.is_file():
        _write_answers(chat, teacher, spec, path, max_tokens, temperature, seed, progress)
    elif progress:
        print(f"dump: reading the teacher's answers kept in {path}", file=sys.stderr)
    return CorpusSpec(str(path), text_field=ConversationFields())


def _write_answers(chat, teacher, spec, path: Path, max_tokens, temperature, seed, progress) -> None:
    stops = set(chat.end_of_turn_ids()) | set(teacher.vocab.special_ids)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    written = 0
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as out:
            for number, (key, data) in enumerate(select_documents(spec)):
                try:
                    messages = parse_conversation(data)
                except MalformedConversation:
                    out.write(json.dumps({"key": key, "messages": json.loads(data)["messages"]}, ensure_ascii=False))
                    out.write("\n")  # refused again, and listed, when the dump reads it
                    continue
                if messages[-1]["role"] == "assistant":
                    messages = messages[:-1]
                if messages and messages[-1]["role"] != "assistant":
                    try:
                        answer = answer_of(chat, teacher, messages, stops, max_tokens, temperature, seed + number)
                        messages = [*messages, {"role": "assistant", "content": answer}]
                    except UnencodableDocument:
                        pass  # the dump skips and lists it
                record = {"key": key, "messages": json.loads(conversation_document(messages))["messages"]}
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                written += 1
                if progress:
                    print(f"\rdump: the teacher answered {written} conversations", end="", file=sys.stderr)
        if progress:
            print(file=sys.stderr)
        os.replace(tmp, path)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)


@torch.no_grad()
def answer_of(
    chat: ChatEncoder, teacher, messages, stops: set[int], max_tokens: int, temperature: float, seed: int
) -> str:
    """The teacher's answer to a conversation that ends with a user message."""
    prompt = chat.prompt_ids(messages)
    ids = torch.tensor([list(teacher.context_prefix) + prompt.tolist()], device=teacher.device)
    generator = torch.Generator(device="cpu").manual_seed(seed)
    produced: list[int] = []
    cache = None
    inputs = ids
    for _ in range(max_tokens):
        out = teacher.model(input_ids=inputs, cache=cache, use_cache=True, logits_to_keep=1)
        cache = out.cache
        logits = out.logits[0, -1].float().cpu()
        if temperature > 0:
            probs = torch.softmax(logits / temperature, -1)
            token = int(torch.multinomial(probs, 1, generator=generator))
        else:
            token = int(logits.argmax())
        if token in stops or token >= teacher.vocab.size:
            break
        produced.append(token)
        inputs = torch.tensor([[token]], device=teacher.device)
    return teacher.vocab.bytes_of(np.asarray(produced, np.int64)).decode("utf-8", errors="replace")


def with_answers(config, chat: ChatEncoder, teacher, spec: CorpusSpec) -> CorpusSpec:
    """The corpus a ``--respond`` dump reads: the answers file, written first if it is not there
    (by one process: several jobs would each write it)."""
    if config.job_count > 1 and not answers_path(config.output).is_file():
        raise UserError(
            f"--respond writes {answers_path(config.output)} in one process: run it once without --num-shards first"
        )
    return respond(
        chat,
        teacher,
        spec,
        config.output,
        max_tokens=config.respond_tokens,
        temperature=config.respond_temperature,
        seed=config.respond_seed,
        progress=config.progress,
    )
