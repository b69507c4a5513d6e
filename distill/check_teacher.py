"""``bytedistill check-teacher``: can this teacher's tokenizer be distilled exactly?

Loads the vocabulary, describes it (family, size, specials, end-of-text ids, prefix handling,
output layer), checks that a model folder or GGUF file holds every weight of its model
(:mod:`distill.teacher.weights`), encodes a built-in sample (multilingual text, code, literal special-token text,
bytes that are not UTF-8) and checks that the token bytes give the sample back exactly, then
converts random logits for the sample on both conversion paths and compares them with a brute
force over the whole vocabulary (prefix tests on every id's bytes, independent of the trie) and
with the log-likelihood identity. Ends with a one-line verdict.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bytestream.alphabet import ALPHABET_SIZE, EOS, EOT
from common.errors import UserError
from configs.ranges import SEED
from distill.teacher.weights import describe_names, missing_weights
from logit_store.file_names import SKIP_LIST

if TYPE_CHECKING:  # the tokenizer and the conversion are imported where they run: `--help` loads no torch
    from bytestream.vocab import TeacherVocab
    from distill.conversion.converter import Converter

SAMPLE: dict[str, bytes] = {
    "english": b"The quick brown fox jumps over the lazy dog. It's 3.14, isn't it?",
    "multilingual": (
        "Grüße aus Köln — déjà vu; Привет, мир; Καλημέρα; مرحبا بالعالم; नमस्ते दुनिया; "
        "天地玄黄，宇宙洪荒；日本語のテキスト（全角）；한국어 문장; e\u0301 n\u0303; 👨‍👩‍👧 🚀"
    ).encode(),
    "code": b"def f(x):\n\tif x:\n        return {'a': [i ** 2 for i in range(10)]}  # ok\n\n\n",
    "special_text": b"</s><s> [INST] hi [/INST] <|endoftext|><|im_start|>user\n<|im_end|> <unk><pad><|begin_of_text|>",
    "leading_space": b"  two leading spaces, trailing spaces   ",
    "not_utf8": b"ok \xc3( cut \xe2\x82 surrogate \xed\xa0\x80 end\x80",  # bytes of UTF-8, invalid sequences
}
TOLERANCE = 1e-9  # relative, float64 brute force against float64 conversion


@dataclass
class CheckTeacherConfig:
    teacher: str = field(
        metadata={
            "help": "teacher or its tokenizer: model folder, Hub id, tokenizer.json or .gguf file",
            "positional": True,
        }
    )
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file name inside a teacher folder"})
    end_of_text: list[str] | None = field(
        default=None, metadata={"help": "end-of-text token(s) (default: the usual names + the tokenizer's eos)"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the random logits for the conversion check", "range": SEED})


@dataclass
class TeacherCheck:
    vocab: TeacherVocab
    token_names: dict[int, str]  # names of the special ids that have one
    output_rows: int | None  # rows of the teacher's output layer, where a model config says
    tokens: int = 0  # sample tokens converted
    conversion_error: float = 0.0  # max relative difference from the brute force, both paths
    identity_error: float = 0.0  # relative difference of Σ log P(stream) from the identity
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def lines(self) -> list[str]:
        v = self.vocab
        named = [f"{self.token_names.get(i, '?')}={i}" for i in v.special_ids if i in self.token_names]
        prefix = (
            "SentencePiece dummy prefix: the teacher reads ' ' + document; the space is context, "
            "the stream starts at its trie node"
            if v.adds_prefix_space
            else "none (the stream starts at the trie root)"
        )
        rows = "unknown (tokenizer only)" if self.output_rows is None else f"{self.output_rows:,} rows"
        if v.output_padding:
            rows += f" ({v.output_padding} padding rows: their mass is dropped with the specials)"
        out = [
            f"teacher          {v.name}",
            f"family           {v.family}",
            f"vocabulary       {v.size - v.output_padding:,} ids, {len(v.regular_ids):,} regular",
            f"specials         {len(v.special_ids)}: {' '.join(named[:12])}{' …' if len(named) > 12 else ''}",
            f"end of text      {', '.join(f'{self.token_names.get(i, i)}={i}' for i in v.end_of_text_ids)}",
            f"before documents {', '.join(f'{self.token_names.get(i, i)}={i}' for i in v.prefix_ids) or 'nothing'}",
            f"prefix handling  {prefix}",
            f"output layer     {rows}",
            f"single bytes     {self.byte_note()}",
            (
                f"sample           {len(SAMPLE)} documents, {sum(map(len, SAMPLE.values())):,} bytes, "
                f"{self.tokens:,} tokens"
            ),
            (
                f"conversion       max relative difference from the brute force {self.conversion_error:.1e} "
                f"(Numba and torch), identity {self.identity_error:.1e}"
            ),
        ]
        return out + [self.verdict()]

    def byte_note(self) -> str:
        missing = np.flatnonzero(self.vocab.single_byte_ids < 0)
        if len(missing) == 0:
            return "every byte value has a token"
        listed = " ".join(f"0x{b:02X}" for b in missing)
        return (
            f"no single-byte token for {listed}: dump skips a document that needs one "
            f"(listed in the store's {SKIP_LIST.shown}; --strict refuses it instead)"
        )

    def verdict(self) -> str:
        if self.ok:
            return f"verdict: OK, {self.vocab.name} can be distilled exactly"
        return f"verdict: FAILED, {self.vocab.name}: {'; '.join(self.failures)}"


def check_teacher(config: CheckTeacherConfig) -> TeacherCheck:
    from bytestream.vocab import load_teacher_tokenizer, split_gguf_path, vocab_from_tokenizer
    from distill.conversion.converter import Converter
    from distill.teacher.encode import DocumentEncoder

    tokenizer = load_teacher_tokenizer(config.teacher, config.gguf_file)
    vocab = vocab_from_tokenizer(tokenizer, name=config.teacher, end_of_text=config.end_of_text)
    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    rows = output_rows(*split_gguf_path(config.teacher, config.gguf_file))
    if rows is not None and rows > vocab.size:
        vocab = vocab.padded_to(rows)
    names = {i: backend.id_to_token(i) for i in vocab.special_ids if backend.id_to_token(i) is not None}
    check = TeacherCheck(vocab, names, rows)
    if rows is not None and rows < vocab.size:
        check.failures.append(f"the output layer has {rows} rows for {vocab.size} tokenizer ids")
    missing = missing_weights(*split_gguf_path(config.teacher, config.gguf_file))
    if missing:
        check.failures.append(
            f"the checkpoint lacks {len(missing)} of its model's weights ({describe_names(missing)}): "
            "dump refuses it (loading it would fill them with random values)"
        )
    encoder = DocumentEncoder(tokenizer, vocab)
    documents = []
    for name, data in SAMPLE.items():
        try:
            documents.append(encoder.encode(data))
        except UserError as exc:
            check.failures.append(f"sample {name!r}: {exc}")
    if documents:
        _check_conversion(check, Converter(vocab), documents, np.random.default_rng(config.seed))
    return check


def output_rows(source: str, gguf_file: str | None = None) -> int | None:
    """The output layer's rows: from a model folder's config.json, or a GGUF file's output tensor
    (the embedding where the output layer is tied to it); None for a bare tokenizer."""
    if gguf_file:
        return gguf_output_rows(Path(source) / gguf_file)
    config = Path(source) / "config.json"
    if not config.is_file():
        return None
    spec = json.loads(config.read_text())
    spec = spec.get("text_config", spec)
    return int(spec["vocab_size"]) if "vocab_size" in spec else None


def gguf_output_rows(path: Path) -> int | None:
    """Rows of a GGUF file's ``output.weight`` (else ``token_embd.weight``; None if it has neither:
    a tokenizer-only file). The tensor list is read, no tensor data."""
    import gguf

    try:
        tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    except Exception as exc:  # noqa: BLE001 - the reader raises several types for a bad file
        raise UserError(f"{path} is not a readable GGUF file ({str(exc).splitlines()[0]})") from None
    for name in ("output.weight", "token_embd.weight"):
        if name in tensors:
            return int(tensors[name].shape[-1])  # GGUF lists dimensions innermost first: (hidden, rows)
    return None


def _check_conversion(check: TeacherCheck, converter: Converter, documents: list[np.ndarray], rng) -> None:
    import torch

    vocab = converter.vocab
    reference = BruteForce(vocab)
    for ids in documents:
        logits = rng.standard_normal((len(ids) + 1, vocab.size)) * 3.0
        numba_dist = converter.convert_numba(ids, logits)
        torch_dist = converter.convert_torch(ids, torch.from_numpy(logits))
        want = reference.dense(ids, logits)
        for dist in (numba_dist, torch_dist):
            got = dist.dense()
            scale = np.maximum(np.abs(want), 1e-300)
            error = float(np.max(np.abs(got - want) / scale, where=want > 0, initial=0.0))
            check.conversion_error = max(check.conversion_error, error)
            if np.any((got > 0) != (want > 0)):
                check.failures.append("the conversion's supports differ from the brute force")
        expected = reference.log_likelihood(ids, logits)
        error = abs(numba_dist.log_likelihood() - expected) / max(abs(expected), 1e-300)
        check.identity_error = max(check.identity_error, error)
        check.tokens += len(ids)
    if check.conversion_error > TOLERANCE:
        check.failures.append(f"the conversion differs from the brute force by {check.conversion_error:.1e}")
    if check.identity_error > TOLERANCE:
        check.failures.append(f"the log-likelihood identity is off by {check.identity_error:.1e}")


class BruteForce:
    """Next-symbol probabilities by prefix tests over every regular id's bytes (no trie)."""

    def __init__(self, vocab: TeacherVocab):
        self.vocab = vocab
        self.regular = vocab.regular_ids
        strings = [vocab.token_bytes[i] for i in self.regular]
        width = max(map(len, strings)) + 1
        self.table = np.full((len(strings), width), EOT, dtype=np.int16)  # byte k of each id, EOT past its end
        for row, s in enumerate(strings):
            self.table[row, : len(s)] = np.frombuffer(s, dtype=np.uint8)
        self.kept = np.concatenate([self.regular, vocab.end_of_text_ids])
        self.twins = defaultdict(list)  # ids sharing a byte string (SentencePiece duplicates)
        for i, s in zip(self.regular.tolist(), strings):
            self.twins[s].append(i)

    def _probabilities(self, row: np.ndarray) -> np.ndarray:
        return np.exp(row - np.logaddexp.reduce(row[self.kept]))

    def dense(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """(positions, 260) probabilities of the stream of ``ids``."""
        out = []
        context = b" " if self.vocab.adds_prefix_space and len(ids) else b""
        for j in range(len(ids) + 1):
            q = self._probabilities(logits[j])[self.regular]
            q_eot = self._probabilities(logits[j])[list(self.vocab.end_of_text_ids)].sum()
            token = self.vocab.token_bytes[ids[j]] if j < len(ids) else b""
            start = len(context) if j == 0 and context else 0
            members = np.arange(len(self.regular))
            for k in range(len(token) + 1):
                if k > 0:
                    members = members[self.table[members, k - 1] == token[k - 1]]
                if k < start:
                    continue
                dist = np.bincount(self.table[members, k], weights=q[members], minlength=ALPHABET_SIZE)
                if k == 0:
                    dist[EOS] = q_eot
                out.append(dist / dist.sum())
                if j == len(ids):
                    break
        return np.array(out)

    def log_likelihood(self, ids: np.ndarray, logits: np.ndarray) -> float:
        """Σ_j log P(bytes of t_j) + log P(end of text) − log P(dummy prefix space at row 0)."""
        total = 0.0
        for j in range(len(ids) + 1):
            q = self._probabilities(logits[j])
            if j == len(ids):
                total += np.log(q[list(self.vocab.end_of_text_ids)].sum())
                break
            total += np.log(q[self.twins[self.vocab.token_bytes[ids[j]]]].sum())
        if self.vocab.adds_prefix_space and len(ids):
            q = self._probabilities(logits[0])
            total -= np.log(q[self.regular[self.table[:, 0] == ord(" ")]].sum())
        return float(total)
