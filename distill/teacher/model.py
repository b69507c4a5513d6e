"""The teacher: any causal LM that ``transformers`` loads, run for the rows the conversion needs.

A teacher is immutable. :meth:`Teacher.with_sorted_head` returns a new teacher whose output layer
is permuted into the conversion's sorted column order (regular ids by byte string, then
end-of-text, then the other specials: :attr:`Converter.sorted_columns`), so its logits arrive
ready for a contiguous conversion; the logits it returns say their column order
(:class:`TeacherLogits`). Logits are computed only for the rows that are kept.
An output layer padded past the tokenizer's ids (Qwen2.5) is accepted: the padding ids join the
dropped specials (:func:`fit_output_layer`).
"""

from __future__ import annotations

import dataclasses
import logging
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bytestream.vocab import TeacherVocab, load_teacher_tokenizer, split_gguf_path, vocab_from_tokenizer
from common.errors import UserError
from distill.conversion.rows import ColumnOrder
from distill.teacher.identity import hub_revision, teacher_name, weights_hash
from distill.teacher.weights import check_weights, one_gguf_reader, one_tensor_name_map, refuse_missing

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TeacherLogits:
    """Float32 logits of teacher rows, and the order of their columns."""

    tensor: torch.Tensor  # (rows, V) float32
    columns: ColumnOrder


@dataclass(frozen=True, eq=False)
class Teacher:
    model: torch.nn.Module
    head: torch.nn.Linear  # the output layer, or a float32 copy of it permuted into ``columns``
    tokenizer: object
    vocab: TeacherVocab
    name: str
    device: torch.device
    dtype: torch.dtype
    columns: ColumnOrder = ColumnOrder.TEACHER  # the column order of ``head``'s logits
    weights_hash: str | None = None  # what its weights are (:mod:`distill.teacher.identity`)
    tokenizer_source: str | None = None  # where its tokenizer was read (a local path or a Hub id)

    @property
    def context_prefix(self) -> list[int]:
        """What precedes every window: the teacher's BOS, else its end-of-text token (a document
        boundary, as in GPT-2-style pretraining), so that the first token has a prediction."""
        return list(self.vocab.prefix_ids) or [self.vocab.end_of_text_ids[0]]

    def with_sorted_head(self, sorted_columns: np.ndarray) -> Teacher:
        """This teacher with a float32 copy of its output layer whose row i is the output layer's
        row ``sorted_columns[i]`` (:attr:`Converter.sorted_columns` of its vocabulary), so that its
        logits are in :attr:`ColumnOrder.SORTED`. Float32 because the trunk may run in bfloat16:
        logits rounded to bf16 would be off by ~0.06 nats at |logit| ≈ 25."""
        head = permuted_head(self.model.get_output_embeddings(), sorted_columns, dtype=torch.float32)
        return dataclasses.replace(self, head=head, columns=ColumnOrder.SORTED)

    @torch.no_grad()
    def hidden_rows(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: list[np.ndarray]
    ) -> torch.Tensor:
        """The trunk's last hidden states at positions ``rows[b]`` of each sequence ``b``, stacked.
        No key/value cache: nothing is generated, and every layer's keys and values would live until
        the forward ends (SmolLM2-135M at the default ``--batch-tokens``: 0.38 GB)."""
        output = self.model.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        hidden = output.last_hidden_state
        batch_index = np.concatenate([np.full(len(r), b) for b, r in enumerate(rows)])
        position_index = np.concatenate(rows)
        return hidden[
            torch.from_numpy(batch_index).to(hidden.device), torch.from_numpy(position_index).to(hidden.device)
        ]

    @torch.no_grad()
    def head_logits(self, hidden: torch.Tensor) -> TeacherLogits:
        """Float32 logits of hidden-state rows, in :attr:`columns` order."""
        logits = self.head(hidden.to(self.head.weight.dtype)).float()
        softcap = getattr(self.model.config, "final_logit_softcapping", None)
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        return TeacherLogits(logits, self.columns)

    def logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: list[np.ndarray]) -> TeacherLogits:
        """Float32 logits at positions ``rows[b]`` of each sequence ``b`` (all rows at once)."""
        return self.head_logits(self.hidden_rows(input_ids, attention_mask, rows))


def default_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_teacher(
    source: str,
    *,
    tokenizer_source: str | None = None,
    gguf_file: str | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    end_of_text: list[str] | None = None,
) -> Teacher:
    """Load a causal LM (folder, Hub id or ``.gguf`` file) and its tokenizer, and check they match
    and that the checkpoint holds every weight (:mod:`distill.teacher.weights`)."""
    model_source, gguf = split_gguf_path(source, gguf_file)
    # a GGUF teacher's file is parsed once per load, not five times; other teachers never import gguf
    with one_gguf_reader() if gguf else nullcontext():
        return _load_teacher(source, model_source, gguf, tokenizer_source, gguf_file, device, dtype, end_of_text)


def _load_teacher(source, model_source, gguf, tokenizer_source, gguf_file, device, dtype, end_of_text) -> Teacher:
    from transformers import AutoModelForCausalLM

    if not Path(model_source).exists() and model_source.startswith((".", "/")):
        raise UserError(f"teacher not found: {model_source}")
    tokenizer_path = tokenizer_source or source
    tokenizer = load_teacher_tokenizer(tokenizer_path, None if tokenizer_source else gguf)
    tokenizer_gguf = None if tokenizer_source else gguf_file  # a GGUF file the flag names inside a folder
    vocab = vocab_from_tokenizer(tokenizer, name=teacher_name(tokenizer_path, tokenizer_gguf), end_of_text=end_of_text)

    device = torch.device(device)
    dtype = dtype or default_dtype(device)
    kwargs = {"gguf_file": gguf} if gguf else {}
    check_weights(source, model_source, gguf)  # before memory is allocated for a model
    try:
        with one_tensor_name_map() if gguf else nullcontext():
            model, loading = AutoModelForCausalLM.from_pretrained(
                model_source, dtype=dtype, output_loading_info=True, use_kernels=False, **kwargs
            )
    except Exception as exc:  # noqa: BLE001 - transformers raises many types for a bad source
        raise UserError(f"cannot load the teacher {source}: {str(exc).splitlines()[0]}") from None
    refuse_missing(source, loading.get("missing_keys", ()))
    model.to(device).eval()
    head = model.get_output_embeddings()
    vocab = fit_output_layer(vocab, head.weight.shape[0])
    revision = None if Path(model_source).exists() else hub_revision(model_source, gguf or "config.json")
    return Teacher(
        model,
        head,
        tokenizer,
        vocab,
        name=teacher_name(source, gguf_file),
        device=device,
        dtype=dtype,
        weights_hash=weights_hash(model_source, gguf, revision),
        tokenizer_source=_joined(tokenizer_path, tokenizer_gguf),
    )


def _joined(source: str, gguf_file: str | None) -> str:
    return str(Path(source) / gguf_file) if gguf_file else str(source)


def fit_output_layer(vocab: TeacherVocab, rows: int) -> TeacherVocab:
    """The vocabulary for an output layer of ``rows`` rows: rows past the tokenizer's ids (a
    padded layer) become specials whose mass is dropped; fewer rows than ids do not belong together."""
    if rows < vocab.size:
        raise UserError(
            f"the tokenizer has {vocab.size} ids but the teacher's output layer has only {rows} rows: "
            "they do not belong together"
        )
    if rows > vocab.size:
        logger.warning(
            "the teacher's output layer has %d rows past the tokenizer's %d ids (padding): their mass "
            "is dropped with the special tokens' and counted in the dropped special mass",
            rows - vocab.size,
            vocab.size,
        )
    return vocab.padded_to(rows)


def permuted_head(head: torch.nn.Linear, column_order: np.ndarray, dtype: torch.dtype | None = None) -> torch.nn.Linear:
    """A copy of the output layer (in ``dtype``, default its own) whose row i is the old row ``column_order[i]``."""
    index = torch.from_numpy(np.asarray(column_order)).to(head.weight.device)
    out = torch.nn.Linear(head.in_features, head.out_features, bias=head.bias is not None)
    out = out.to(device=head.weight.device, dtype=dtype or head.weight.dtype)
    with torch.no_grad():
        out.weight.copy_(head.weight.index_select(0, index))
        if head.bias is not None:
            out.bias.copy_(head.bias.index_select(0, index))
    return out.eval()
