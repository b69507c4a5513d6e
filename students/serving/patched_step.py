"""The patched student's decode step for the engine: local encoder, the global model for the rows
whose symbol closes a patch, local decoder, each row at its own position, over state allocated
once for every slot.

The prompt runs through the model's own forward with a fresh ``PatchedCache`` (one call), which is
then copied into the slot: its local rings, global keys/values, open patch and latest global
output. A step runs the model's own blocks. Unlike ``generate``'s cache, whose rows share one step
counter (a batch starts together, padded on the left), every slot here has its own position and
its own ring of the last ``local_window`` local keys/values (``ring_position``: the position each
ring entry holds, -1 none), so requests join and leave at any step. The global step is the
model's own (``global_step`` eagerly, for exactly the closing rows; ``masked_global_step`` when
compiled, for their count rounded up to a power of two), reading this object as its cache.
"""

from __future__ import annotations

import copy

import torch

from students.models.patched_model import PatchedCache
from students.serving.flat_step import bucket


class PatchedStepper:
    """Per-slot rings, global keys/values and patch state, and the step over them. Has the
    attributes ``PatchedStudent.global_step`` reads of a cache (``open_sum``, ``open_count``,
    ``context``, ``global_length``, ``global_k``, ``global_v``)."""

    def __init__(self, model, slots: int, device: torch.device):
        config = model.config
        self.model, self.slots, self.device = model, slots, device
        self.window = config.local_window
        self.capacity = config.max_position_embeddings + 2  # a patch per symbol at most, and the start
        self.vocab_size = config.vocab_size
        dtype = next(model.parameters()).dtype
        dl, dg = config.local_hidden_size, config.global_hidden_size
        local_heads, global_heads = config.local_heads, config.global_heads

        def zeros(*shape, dtype=dtype):
            return torch.zeros(*shape, dtype=dtype, device=device)

        ring = (slots, local_heads, self.window, dl // local_heads)
        self.local = [(zeros(*ring), zeros(*ring)) for _ in range(config.encoder_layers + config.decoder_layers)]
        self.ring_position = torch.full((slots, self.window), -1, dtype=torch.long, device=device)
        entries = (slots, global_heads, self.capacity, dg // global_heads)
        self.global_k = [zeros(*entries) for _ in range(config.global_layers)]
        self.global_v = [zeros(*entries) for _ in range(config.global_layers)]
        self.global_length = torch.zeros(slots, dtype=torch.long, device=device)
        self.open_sum = zeros(slots, dl)
        self.open_count = zeros(slots)
        self.context = zeros(slots, dg)
        self.rows = torch.arange(slots, device=device)

    def static_tensors(self) -> list[torch.Tensor]:
        rings = [tensor for pair in self.local for tensor in pair]
        state = [self.ring_position, self.global_length, self.open_sum, self.open_count, self.context]
        return [*rings, *self.global_k, *self.global_v, *state]

    def view(self, width: int) -> PatchedStepper:
        """The same stepper over the first ``width`` slots (views: writes reach this one's state)."""
        view = copy.copy(self)
        view.slots = width
        view.local = [(k[:width], v[:width]) for k, v in self.local]
        view.global_k = [tensor[:width] for tensor in self.global_k]
        view.global_v = [tensor[:width] for tensor in self.global_v]
        for name in ("ring_position", "global_length", "open_sum", "open_count", "context", "rows"):
            setattr(view, name, getattr(self, name)[:width])
        return view

    @torch.no_grad()
    def prefill(self, slot: int, symbols: list[int]) -> tuple[torch.Tensor, int]:
        """Run ``symbols`` as row ``slot``'s context with the model's own forward; its last logits
        (V,) and the global entries it holds."""
        cache = PatchedCache(capacity=len(symbols))
        output = self.model(input_ids=torch.tensor([symbols], device=self.device), cache=cache, use_cache=True)
        for (ring_k, ring_v), (new_k, new_v) in zip(self.local, cache.local):
            ring_k[slot], ring_v[slot] = new_k[0], new_v[0]
        length = len(symbols)
        self.ring_position[slot] = -1
        kept = torch.arange(max(length - self.window, 0), length, device=self.device)
        self.ring_position[slot, kept % self.window] = kept
        entries = int(cache.global_length[0])
        for mine, theirs in ((self.global_k, cache.global_k), (self.global_v, cache.global_v)):
            for tensor, new in zip(mine, theirs):
                tensor[slot, :, :entries] = new[0, :, :entries]
        self.global_length[slot] = entries
        self.open_sum[slot], self.open_count[slot] = cache.open_sum[0], cache.open_count[0]
        self.context[slot] = cache.context[0]
        return output.logits[0, -1], entries

    def step(
        self, symbols: torch.Tensor, positions: torch.Tensor, closing: torch.Tensor, stepping: int, used: int
    ) -> torch.Tensor:
        """Logits (B, V) after one more symbol per row. ``closing`` (B,): the rows whose symbol closes
        a patch; ``stepping``: how many rows the global model steps (0: none; the batch: all; a
        count at least the closing rows': the compiled path) reading ``used`` global entries."""
        h, where = self._encode(symbols, positions)
        if stepping:
            self.model.masked_global_step(closing, self, stepping, used)
        return self._decode(h, where)

    def eager_step(self, symbols: torch.Tensor, positions: torch.Tensor, closing_rows: list[int]) -> torch.Tensor:
        """:meth:`step` with the global model stepping for exactly ``closing_rows`` (as ``generate``'s
        eager step does), reading exactly the entries they use."""
        h, where = self._encode(symbols, positions)
        if closing_rows:
            rows = torch.tensor(closing_rows, device=self.device)
            every = len(closing_rows) == self.slots
            used = int(self.global_length[rows].max()) + 1
            self.model.global_step(rows, self, every, used)
        return self._decode(h, where)

    def _encode(self, symbols: torch.Tensor, positions: torch.Tensor):
        """Each row's local state (B, 1, local) through the encoder, pooled into its open patch, and
        where it sits (position, ring slot, the ring entries it may read)."""
        model = self.model
        slot = positions % self.window
        self.ring_position[self.rows, slot] = positions
        readable = (self.ring_position >= 0)[:, None, None, :]
        where = (positions.unsqueeze(-1), slot, readable)
        h = model.embed(symbols).unsqueeze(1)
        for index, block in enumerate(model.encoder):
            h = self._local(h, block, self.local[index], where)
        if model.config.patch_pooling == "last":
            self.open_sum.copy_(h[:, 0])
            self.open_count.fill_(1.0)
        else:
            self.open_sum.add_(h[:, 0])
            self.open_count.add_(1.0)
        return h, where

    def global_bucket(self, longest: int) -> int:
        """Global entries a compiled step reads when the longest stepping row holds ``longest``."""
        return bucket(longest + 1, self.capacity)

    def _decode(self, h: torch.Tensor, where) -> torch.Tensor:
        model = self.model
        x = h + model.global_down(self.context).unsqueeze(1)
        for index, block in enumerate(model.decoder, start=len(model.encoder)):
            x = self._local(x, block, self.local[index], where)
        return model.lm_head(model.final_norm(x))[:, 0]

    def _local(self, x: torch.Tensor, block, ring: tuple[torch.Tensor, torch.Tensor], where) -> torch.Tensor:
        """One symbol per row through a local layer: each row's key/value into its ring slot."""
        keys, values = ring
        position, slot, mask = where
        rows = self.rows

        def join(k, v):
            keys[rows, :, slot] = k[:, :, 0]
            values[rows, :, slot] = v[:, :, 0]
            return keys, values

        return block(x, position, mask, join)
