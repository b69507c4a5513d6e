"""``dump --chat --respond``: the teacher writes the answers, and the dump distils its own answers
(sequence-level distillation; docs/DESIGN.md, "Conversations").

Every selected conversation gets its last assistant turn from the teacher: a conversation that ends
with a user message gets a new one, one that ends with an assistant message has it rewritten. The
prompt is the conversation rendered with the template's generation prompt, read as the dump reads
it; the teacher writes until a special that ends its turn (or any other special, or its end of
text), at most ``--respond-tokens`` tokens, greedily or sampled at ``--respond-temperature``.

The teacher answers ``--respond-batch`` conversations at a time (``transformers``' ``generate`` on a
left-padded batch); batch ``k`` holds conversations ``k·B … k·B + B - 1`` of the corpus, and a sampled
batch draws from ``--respond-seed`` plus the number of its first conversation, so the answers depend
on the settings and the corpus alone, not on when the run was stopped. Bytes that are not UTF-8 (a
cut character) are replaced by U+FFFD.

The answered conversations are kept beside the store as a corpus of messages, ``OUTPUT.answers.jsonl``
(one ``{"key", "messages"}`` per line, in corpus order), and the dump reads that file. It is built
in ``OUTPUT.answers.jsonl.partial``, whose first line records the settings, one batch appended at a
time; a run stopped part-way resumes from its last whole batch, and the finished file replaces the
partial one in one rename, so ``OUTPUT.answers.jsonl`` exists only complete. A rerun finds it and does
not answer again.
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from common.errors import UserError
from common.files import open_own
from distill.corpus.conversations import ConversationFields, conversation_document
from distill.corpus.spec import CorpusSpec, select_documents
from distill.teacher.chat import ChatEncoder, MalformedConversation, parse_conversation
from distill.teacher.encode import UnencodableDocument

ANSWERS_SUFFIX = ".answers.jsonl"
PARTIAL_SUFFIX = ".partial"


@dataclass(frozen=True)
class RespondSettings:
    """How the teacher writes the answers (recorded in the partial file: a resumed run must match)."""

    max_tokens: int
    temperature: float
    seed: int
    batch: int


def answers_path(output: str | Path) -> Path:
    """Where the teacher's answers are kept: beside the store directory."""
    output = Path(output)
    return output.with_name(output.name + ANSWERS_SUFFIX)


def partial_path(output: str | Path) -> Path:
    """Where the answers are built until every conversation has one."""
    path = answers_path(output)
    return path.with_name(path.name + PARTIAL_SUFFIX)


def respond(
    chat: ChatEncoder, teacher, spec: CorpusSpec, output: str | Path, settings: RespondSettings, progress: bool = True
) -> CorpusSpec:
    """Write the answers file (unless it exists) and return the corpus that reads it."""
    path = answers_path(output)
    if not path.is_file():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_answers(chat, teacher, spec, Path(output), settings, progress)
        except OSError as exc:
            raise UserError(f"cannot write {partial_path(output)}: {exc.strerror or exc}") from None
    elif progress:
        print(f"dump: reading the teacher's answers kept in {path}", file=sys.stderr)
    return CorpusSpec(str(path), text_field=ConversationFields())


def _write_answers(chat, teacher, spec, output: Path, settings: RespondSettings, progress: bool) -> None:
    from tqdm.auto import tqdm

    partial = partial_path(output)
    with os.fdopen(open_own(partial, os.O_RDWR | os.O_CREAT), "r+b") as file:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{partial} is being written by another dump: wait for it, or stop it") from None
        done = _resume(file, partial, settings)
        documents = select_documents(spec)
        _check_resumed_keys(done, documents, partial)
        stops = _stop_ids(chat, teacher)
        bar = tqdm(desc="dump: the teacher answers", unit="conv", initial=len(done), disable=not progress)
        for number, batch in _batches(documents, len(done), settings.batch):
            records = answered_records(chat, teacher, batch, stops, settings, number)
            file.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8"))
            file.flush()
            os.fsync(file.fileno())
            bar.update(len(records))
        bar.close()
        _finish(file, partial, answers_path(output))


def _resume(file, partial: Path, settings: RespondSettings) -> list[str]:
    """The keys of the whole batches the partial file holds (the file cut after them), after its
    settings line is checked against this run's; a file with no answer yet gets this run's settings line."""
    header = json.dumps({"respond": asdict(settings)}) + "\n"
    lines = file.read().decode("utf-8", errors="replace").split("\n")
    if len(lines) <= 2:  # no answer yet: this run's settings replace any recorded
        file.seek(0)
        file.truncate()
        file.write(header.encode("utf-8"))
        return []
    if lines[0] + "\n" != header:
        raise UserError(
            f"{partial} holds answers written with other settings ({lines[0]}, this run: {header.strip()}): "
            "rerun with those, or remove it"
        )
    whole = lines[1:-1]  # the last piece is a line cut part-way, or empty
    keep = len(whole) - len(whole) % settings.batch
    keys = []
    for line in whole[:keep]:
        try:
            keys.append(json.loads(line)["key"])
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{partial} has a damaged line: remove it to answer again") from None
    file.seek(0)
    file.truncate(len(header.encode("utf-8")) + sum(len(line.encode("utf-8")) + 1 for line in whole[:keep]))
    file.seek(0, os.SEEK_END)
    return keys


def _check_resumed_keys(done: list[str], documents: Iterator[tuple], partial: Path) -> None:
    """Consume the documents already answered, refusing a corpus that changed under the partial file."""
    for key, (corpus_key, _) in zip(done, itertools.islice(documents, len(done))):
        if key != corpus_key:
            raise UserError(
                f"{partial} was written for another corpus (it has {key!r} where the corpus has {corpus_key!r}): "
                "remove it to answer again"
            )


def _batches(documents: Iterator[tuple], start: int, size: int) -> Iterator[tuple[int, list[tuple]]]:
    """``(number of the first, documents)`` for each batch of ``size`` documents from number ``start``."""
    number = start
    while batch := list(itertools.islice(documents, size)):
        yield number, batch
        number += len(batch)


def _finish(file, partial: Path, path: Path) -> None:
    """Move the partial file's answers (all but its settings line) to ``path`` in one rename."""
    file.seek(0)
    answers = file.read().split(b"\n", 1)[1]
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        with os.fdopen(open_own(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as out:
            out.write(answers)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    partial.unlink()


def _stop_ids(chat: ChatEncoder, teacher) -> list[int]:
    """What ends an answer: the end of a turn, any other special, or an id past the vocabulary."""
    stops = set(chat.end_of_turn_ids()) | set(teacher.vocab.special_ids)
    rows = teacher.model.get_output_embeddings().weight.shape[0]
    return sorted(stops | set(range(teacher.vocab.size, rows)))


def answered_records(
    chat: ChatEncoder, teacher, batch: list[tuple], stops: list[int], settings: RespondSettings, first: int
) -> list[dict]:
    """The answers file's records of one batch of ``(key, data)`` documents, numbered from ``first``."""
    records, prompts = [], {}
    for row, (key, data) in enumerate(batch):
        try:
            messages = parse_conversation(data)
        except MalformedConversation:
            records.append({"key": key, "messages": _raw_messages(data)})  # refused again, and listed, by the dump
            continue
        if messages[-1]["role"] == "assistant":
            messages = messages[:-1]
        if messages and messages[-1]["role"] != "assistant":
            try:
                prompts[row] = list(teacher.context_prefix) + chat.prompt_ids(messages).tolist()
            except UnencodableDocument:
                pass  # the dump skips and lists it
        records.append({"key": key, "messages": messages})
    answers = teacher_answers(teacher, list(prompts.values()), stops, settings, first)
    for row, answer in zip(prompts, answers):
        records[row]["messages"] = [*records[row]["messages"], {"role": "assistant", "content": answer}]
    for record in records:
        if isinstance(record["messages"], list):
            record["messages"] = json.loads(conversation_document(record["messages"]))["messages"]
    return records


def _raw_messages(data: bytes):
    """A malformed conversation's messages as its corpus form holds them (None if it is not JSON)."""
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return None
    return record.get("messages") if isinstance(record, dict) else None


@torch.no_grad()
def teacher_answers(teacher, prompts: list[list[int]], stops: list[int], settings: RespondSettings, seed_offset: int):
    """The teacher's answers (text) to prompts of token ids, in one left-padded ``generate`` call."""
    from transformers import GenerationConfig

    if not prompts:
        return []
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[stops[0]] * (width - len(p)) + p for p in prompts], device=teacher.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=teacher.device)
    sampled = settings.temperature > 0
    config = GenerationConfig(
        max_new_tokens=settings.max_tokens,
        do_sample=sampled,
        temperature=settings.temperature if sampled else None,
        top_k=None,
        top_p=None,
        eos_token_id=stops,
        pad_token_id=stops[0],
    )
    devices = [teacher.device] if teacher.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(settings.seed + seed_offset)
        out = teacher.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    answers, ends = [], set(stops)
    for row in out[:, width:].tolist():
        produced = list(itertools.takewhile(lambda token: token not in ends, row))
        answers.append(teacher.vocab.bytes_of(np.asarray(produced, np.int64)).decode("utf-8", errors="replace"))
    return answers


def with_answers(config, chat: ChatEncoder, teacher, spec: CorpusSpec) -> CorpusSpec:
    """The corpus a ``--respond`` dump reads: the answers file, written first if it is not there
    (by one process: several jobs would each write it)."""
    if config.job_count > 1 and not answers_path(config.output).is_file():
        raise UserError(
            f"--respond writes {answers_path(config.output)} in one process: run it once without --num-shards first"
        )
    settings = RespondSettings(
        max_tokens=config.respond_tokens,
        temperature=config.respond_temperature,
        seed=config.respond_seed,
        batch=config.respond_batch,
    )
    return respond(chat, teacher, spec, config.output, settings, progress=config.progress)
