"""What a student architecture is to the rest of bytedistill: one :class:`Architecture` object per
student, in the registry of :mod:`students.models.architectures`. Training builds it from a
:class:`~students.models.shape.StudentShape`, export loads it from a trainer checkpoint, ships its files and
describes it in the card, ``score`` and ``generate`` load its exported folder through
``AutoModelForCausalLM``, and :mod:`students.models.cost` counts what it costs; none of them knows which
architecture it holds.

Importing it loads no torch: ``bytedistill train --help`` lists the architectures by name.
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from safetensors import SafetensorError

from common.errors import UserError, first_line

if TYPE_CHECKING:
    from students.models.cost import StudentCost

# what torch, safetensors and pickle raise for a file that is truncated or not theirs, or a full disk
STATE_ERRORS = (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError, SafetensorError)


class Architecture(ABC):
    """A student architecture: its names, how it is built, loaded, exported, described and costed."""

    name: ClassVar[str]  # ``train --architecture``; the card and ``run_info.json`` show it
    model_type: ClassVar[str]  # its ``config.json``'s ``model_type``, by which a saved student is told
    summary: ClassVar[str]  # one line for ``train --help``
    card_name: ClassVar[str]  # the card's first sentence: "a byte-level causal language model (…)"
    card_loading: ClassVar[str]  # the card's usage snippet: how the model is loaded
    card_code: ClassVar[str]  # the card's tokenizer section: what code the model needs

    @abstractmethod
    def build(self, shape: Any, *, seq_len: int, seed: int, reserved: tuple[str, ...] = ()) -> Any:
        """A freshly initialised student of ``shape`` (a :class:`students.models.shape.StudentShape`,
        which lists the architectures and so is not imported here), seeded by ``seed``; its positions are
        ``shape.max_positions``, else ``seq_len``; its alphabet is the stream's and the ``reserved``
        symbols after it (their texts, recorded in its config as ``reserved_symbols``)."""

    def stream_from_stores(self, stored: Any) -> Any:
        """The stream this architecture's student reads from stores of the stream ``stored`` when
        ``train --stream`` is ``auto``: the stores' own by default."""
        return stored

    def refuse_stream(self, stream: Any) -> None:
        """Refuse, in one line, a stream (a :class:`bytestream.stream_kind.StreamKind`) this architecture
        cannot read (none by default)."""

    @abstractmethod
    def load(self, checkpoint: Path, saved_config: dict[str, Any]) -> Any:
        """The student saved in a trainer checkpoint (its ``config.json`` read as ``saved_config``),
        in eval mode; weights must match exactly (:func:`load_weights`)."""

    def register_auto_classes(self) -> None:
        """Make ``AutoModelForCausalLM`` load an exported folder of this architecture with this
        library's own class (a stock transformers model needs nothing)."""

    def auto_map(self) -> dict[str, str] | None:
        """The ``auto_map`` an export writes into ``config.json`` (None: the model is stock transformers)."""
        return None

    def export_files(self, model, folder: Path) -> None:
        """Write the files the exported folder needs besides the weights and config (none by default)."""

    @abstractmethod
    def card_sizes(self, config) -> str:
        """The card's "sizes" row: layers and widths of ``config``."""

    @abstractmethod
    def cost(self, model) -> StudentCost:
        """Parameters, FLOPs and cache sizes of ``model`` (:mod:`students.models.cost`)."""

    def memory_floats(self, shape: Any, *, batch_size: int, seq_len: int, alphabet: int) -> tuple[int, int]:
        """What training a student of ``shape`` over ``alphabet`` symbols holds, counted before it is
        built: (its parameters, the floats one micro-batch of ``batch_size`` windows of ``seq_len``
        symbols keeps for the backward pass). By default the parameters of the model built on torch's
        meta device (which allocates nothing) and no activations, a floor; an architecture that knows
        its formulas counts both without building anything."""
        import torch

        with torch.device("meta"):
            model = self.build(shape, seq_len=seq_len, seed=0)
        return sum(parameter.numel() for parameter in model.parameters()), 0


def load_weights(model, weights_file: Path, architecture: str, tied: frozenset[str] = frozenset()) -> None:
    """Load a checkpoint's safetensors into ``model``; a damaged file or weights that do not match the
    config exactly (``tied``: names the model fills itself) is a UserError naming the file."""
    from safetensors.torch import load_file

    try:
        weights = load_file(str(weights_file))
    except STATE_ERRORS as exc:
        raise UserError(f"{weights_file} does not read ({first_line(exc)}): the file is damaged") from None
    problem = f"{weights_file} does not match its config (a {architecture} student)"
    try:
        missing, unexpected = model.load_state_dict(weights, strict=False)
    except RuntimeError as exc:  # a tensor of another shape
        raise UserError(f"{problem}: {str(exc).strip().splitlines()[-1].strip()}") from exc
    if set(missing) - tied or unexpected:
        raise UserError(f"{problem}: missing {missing[:3]}, unexpected {unexpected[:3]}")
