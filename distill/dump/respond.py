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
on the settings, the teacher and the corpus alone, not on when the run was stopped. Bytes that are
not UTF-8 (a cut character) are replaced by U+FFFD.

The answered conversations are kept beside the store as a corpus of messages, ``OUTPUT.answers.jsonl``
(one ``{"key", "messages"}`` per line, in corpus order), and the dump reads that file. It is built
in ``OUTPUT.answers.jsonl.partial``, one batch appended at a time. The partial file's first line
records what the answers are a function of besides the corpus: the settings, the teacher (its
weights' hash and its vocabulary's, as the store records them) and the chat template's SHA-256.
Each batch's answers are followed by a check line: the batch's size, a hash of its conversations
as the corpus held them (key and content) and a hash of the answer lines written. The finished file
replaces the partial one in one rename, so ``OUTPUT.answers.jsonl`` exists only complete; the first
line and the check lines are kept beside it in ``OUTPUT.answers.jsonl.checks``.

A rerun checks what it finds (the partial file, or the finished file with its checks) before it
uses any of it:

- another teacher, template or settings than recorded: refused in one line naming what differs,
  the files left as they are (rerun with the same ones, or remove the file to answer again);
- a file without these records (written by an earlier version): refused in one line, remove it;
- a batch whose answers do not match their hash (the file was edited): refused in one line, since
  answers the teacher did not write would be distilled as its own, and which lines were changed
  is not known (this detects edits and damage, not a forger who also rewrites the hash);
- a batch whose conversations changed in the corpus (another content, key or number of them): it
  and every batch after it are answered again, the batches before it are kept as they are.

A finished file whose conversations all match is read as it is.
"""

from __future__ import annotations

import fcntl
import hashlib
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
from distill.dump.config import RespondSettings
from distill.teacher.chat import ChatEncoder, MalformedConversation, parse_conversation
from distill.teacher.encode import UnencodableDocument

ANSWERS_SUFFIX = ".answers.jsonl"
PARTIAL_SUFFIX = ".partial"
CHECKS_SUFFIX = ".checks"
CHECK_START = b'{"batch": '  # how a check line starts (an answer line starts with {"key")


@dataclass(frozen=True)
class AnsweredBatch:
    """One batch of an answers file: its answer lines and its check line (each ending in a newline)."""

    lines: list[bytes]
    check_line: bytes

    @property
    def check(self) -> dict:
        return json.loads(self.check_line)["batch"]


def answers_path(output: str | Path) -> Path:
    """Where the teacher's answers are kept: beside the store directory."""
    output = Path(output)
    return output.with_name(output.name + ANSWERS_SUFFIX)


def partial_path(output: str | Path) -> Path:
    """Where the answers are built until every conversation has one."""
    path = answers_path(output)
    return path.with_name(path.name + PARTIAL_SUFFIX)


def checks_path(output: str | Path) -> Path:
    """Where the finished answers' first line and check lines are kept."""
    path = answers_path(output)
    return path.with_name(path.name + CHECKS_SUFFIX)


def answers_header(chat: ChatEncoder, teacher, settings: RespondSettings) -> dict:
    """What the answers are a function of besides the corpus (the answers files' first line)."""
    return {
        "respond": asdict(settings),
        "teacher": teacher.weights_hash,
        "vocabulary": teacher.vocab.hash,
        "chat_template": chat.template.sha256,
    }


def conversations_hash(documents: list[tuple]) -> str:
    """SHA-256 of a batch's conversations as the corpus holds them: each key and content."""
    digest = hashlib.sha256(b"bytedistill-respond-conversations-v1\0")
    for key, data, *_ in documents:
        for part in (key.encode("utf-8"), bytes(data)):
            digest.update(len(part).to_bytes(8, "little") + part)
    return digest.hexdigest()


def answers_hash(lines: list[bytes]) -> str:
    """SHA-256 of a batch's answer lines as written."""
    return hashlib.sha256(b"bytedistill-respond-answers-v1\0" + b"".join(lines)).hexdigest()


def check_line(documents: list[tuple], lines: list[bytes]) -> bytes:
    """The check line written after a batch's answer lines."""
    check = {"size": len(lines), "conversations": conversations_hash(documents), "answers": answers_hash(lines)}
    return json.dumps({"batch": check}).encode("utf-8") + b"\n"


def respond(
    chat: ChatEncoder,
    teacher,
    spec: CorpusSpec,
    output: str | Path,
    settings: RespondSettings,
    progress: bool = True,
    may_write: bool = True,
) -> CorpusSpec:
    """Write the answers file (unless one that matches the teacher, settings and corpus exists) and
    return the corpus that reads it; ``may_write`` False refuses to write it."""
    path = answers_path(output)
    header = answers_header(chat, teacher, settings)
    if path.is_file() and _finished_is_current(Path(output), header, spec, settings.batch):
        if progress:
            print(f"dump: reading the teacher's answers kept in {path}", file=sys.stderr)
        return CorpusSpec(str(path), text_field=ConversationFields())
    if not may_write:
        raise UserError(f"--respond writes {path} in one process: run it once without --num-shards first")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_answers(chat, teacher, spec, Path(output), settings, header, progress)
    except OSError as exc:
        raise UserError(f"cannot write {partial_path(output)}: {exc.strerror or exc}") from None
    return CorpusSpec(str(path), text_field=ConversationFields())


def _finished_is_current(output: Path, header: dict, spec: CorpusSpec, size: int) -> bool:
    """Whether the finished answers file was written for this run and the corpus as it is now
    (refused if it is not this run's teacher, template or settings, or was edited)."""
    first, batches = _finished_batches(output)
    _check_header(first, header, answers_path(output))
    kept, rest = _kept_batches(batches, select_documents(spec), size, answers_path(output))
    return len(kept) == len(batches) and next(rest, None) is None


def _finished_batches(output: Path) -> tuple[bytes, list[AnsweredBatch]]:
    """The finished answers' first line and batches, read from the answers and checks files."""
    path, checks = answers_path(output), checks_path(output)
    if not checks.is_file():
        raise UserError(
            f"{path} was written by an earlier version (no {checks.name} beside it): remove it to answer again"
        )
    first, _, rest = checks.read_bytes().partition(b"\n")
    lines = path.read_bytes().splitlines(keepends=True)
    batches, start = [], 0
    for line in rest.splitlines(keepends=True):
        try:
            size = json.loads(line)["batch"]["size"]
        except (ValueError, KeyError, TypeError):
            raise UserError(f"{checks} has a damaged line: remove {path} and it to answer again") from None
        batches.append(AnsweredBatch(lines[start : start + size], line))
        start += size
    if start != len(lines):
        raise UserError(f"{path} does not hold the answers {checks.name} counts (edited?): remove it to answer again")
    return first, batches


def _write_answers(chat, teacher, spec, output: Path, settings: RespondSettings, header: dict, progress) -> None:
    from tqdm.auto import tqdm

    partial = partial_path(output)
    with os.fdopen(open_own(partial, os.O_RDWR | os.O_CREAT), "r+b") as file:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"{partial} is being written by another dump: wait for it, or stop it") from None
        if answers_path(output).is_file():
            _reopen_finished(file, output)
        done, documents = _resume(file, partial, header, select_documents(spec), settings.batch, progress)
        stops = _stop_ids(chat, teacher)
        bar = tqdm(desc="dump: the teacher answers", unit="conv", initial=done, disable=not progress)
        for number, batch in _batches(documents, done, settings.batch):
            records = answered_records(chat, teacher, batch, stops, settings, number)
            lines = [json.dumps(r, ensure_ascii=False).encode("utf-8") + b"\n" for r in records]
            file.write(b"".join(lines) + check_line(batch, lines))
            file.flush()
            os.fsync(file.fileno())
            bar.update(len(records))
        bar.close()
        _finish(file, partial, output)


def _reopen_finished(file, output: Path) -> None:
    """Make the finished answers (whose corpus changed) the partial file again, to be resumed."""
    first, batches = _finished_batches(output)
    file.seek(0)
    file.truncate()
    file.write(first + b"\n" + b"".join(b"".join(b.lines) + b.check_line for b in batches))
    file.flush()
    os.fsync(file.fileno())
    answers_path(output).unlink()
    checks_path(output).unlink()
    file.seek(0)


def _resume(file, partial: Path, header: dict, documents: Iterator[tuple], size: int, progress: bool):
    """``(conversations kept, the documents left to answer)``: the partial file cut back to the whole
    batches it can keep, after its first line is checked against this run; a file with no answer yet
    gets this run's first line."""
    first, _, rest = file.read().partition(b"\n")
    if b"\n" not in rest:  # no answer yet: this run's first line replaces any recorded
        file.seek(0)
        file.truncate()
        file.write(json.dumps(header).encode("utf-8") + b"\n")
        return 0, documents
    _check_header(first, header, partial)
    batches = _whole_batches(rest)
    kept, documents = _kept_batches(batches, documents, size, partial)
    if len(kept) < len(batches) and progress:
        print(
            f"dump: batch {len(kept)} of {partial} was answered for other conversations: answering again from it",
            file=sys.stderr,
        )
    done = sum(len(b.lines) for b in kept)
    file.seek(0)
    file.truncate(len(first) + 1 + sum(len(b"".join(b.lines)) + len(b.check_line) for b in kept))
    file.seek(0, os.SEEK_END)
    return done, documents


def _whole_batches(body: bytes) -> list[AnsweredBatch]:
    """The batches closed by a check line (what follows the last one was cut part-way)."""
    batches, lines = [], []
    for line in body.splitlines(keepends=True):
        if line.startswith(CHECK_START) and line.endswith(b"\n"):
            batches.append(AnsweredBatch(lines, line))
            lines = []
        else:
            lines.append(line)
    return batches


def _check_header(first: bytes, header: dict, where: Path) -> None:
    """Refuse answers recorded for another teacher, template or settings, or without a record."""
    try:
        recorded = json.loads(first)
    except ValueError:
        recorded = None
    if not isinstance(recorded, dict) or set(recorded) != set(header):
        raise UserError(
            f"{where} was written by an earlier version (it records no teacher, template or checks): "
            "remove it to answer again"
        )
    if recorded["respond"] != header["respond"]:
        raise UserError(
            f"{where} holds answers written with other settings ({recorded['respond']}, this run: "
            f"{header['respond']}): rerun with those, or remove it"
        )
    if (recorded["teacher"], recorded["vocabulary"]) != (header["teacher"], header["vocabulary"]):
        raise UserError(
            f"{where} holds answers written by another teacher (weights {recorded['teacher']}, this run's "
            f"{header['teacher']}): rerun with that teacher, or remove it to answer again"
        )
    if recorded["chat_template"] != header["chat_template"]:
        raise UserError(
            f"{where} holds answers written with another chat template (sha256 {recorded['chat_template']}, "
            f"this run's {header['chat_template']}): rerun with that template, or remove it to answer again"
        )


def _kept_batches(batches: list[AnsweredBatch], documents: Iterator[tuple], size: int, where: Path):
    """``(kept, the documents after them)``: the leading batches whose conversations are the corpus's
    now; a batch whose answer lines do not match their hash is refused."""
    kept = []
    for batch in batches:
        check = _batch_check(batch, where, len(kept))
        if check["answers"] != answers_hash(batch.lines) or check["size"] != len(batch.lines):
            raise UserError(
                f"{where}: the answers of batch {len(kept)} are not those the teacher wrote (the file was edited): "
                "remove it to answer again"
            )
        now = list(itertools.islice(documents, size))
        if check["conversations"] != conversations_hash(now):
            return kept, itertools.chain(now, documents)
        kept.append(batch)
    return kept, documents


def _batch_check(batch: AnsweredBatch, where: Path, number: int) -> dict:
    """A batch's check, refused in one line if it is damaged."""
    try:
        check = batch.check
        if isinstance(check, dict) and {"size", "conversations", "answers"} <= set(check):
            return check
    except (ValueError, KeyError, TypeError):
        pass
    raise UserError(f"{where}: the check line of batch {number} is damaged: remove it to answer again")


def _batches(documents: Iterator[tuple], start: int, size: int) -> Iterator[tuple[int, list[tuple]]]:
    """``(number of the first, documents)`` for each batch of ``size`` documents from number ``start``."""
    number = start
    while batch := list(itertools.islice(documents, size)):
        yield number, batch
        number += len(batch)


def _finish(file, partial: Path, output: Path) -> None:
    """Move the partial file's answer lines to the answers file and its first line and check lines
    to the checks file (the checks first, so an answers file always has its checks)."""
    file.seek(0)
    first, _, body = file.read().partition(b"\n")
    batches = _whole_batches(body)
    _write_whole(checks_path(output), first + b"\n" + b"".join(b.check_line for b in batches))
    _write_whole(answers_path(output), b"".join(b"".join(b.lines) for b in batches))
    partial.unlink()


def _write_whole(path: Path, content: bytes) -> None:
    """Write ``path`` in one rename (it exists only complete)."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    try:
        with os.fdopen(open_own(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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
    """The corpus a ``--respond`` dump reads (``config``: its :class:`DumpConfig`): the answers file,
    written first if there is none that matches this run (by one process: several jobs would each
    write it)."""
    return respond(chat, teacher, spec, config.output, config.answers, config.progress, may_write=config.job_count == 1)
