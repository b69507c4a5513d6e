"""Choosing each row's next symbol on the device, in the same graph as the model's step.

Every row carries its own settings as tensors (``SamplingState``): greedy or not, temperature,
top-k, top-p, a seed and a draw counter. A sampled row draws by the Gumbel-max rule with noise from
a counter-based hash of (seed, draw, symbol), so a request's draws depend on its seed and its own
steps only: the same request gives the same symbols whatever else shares the batch, and no
per-row random generator is stepped in Python. Before choosing, the row's allowed symbols are
applied: the symbols the folder's generation config suppresses, and while a prompt's last word is
fed (healing), only the next byte's two choices (``forced``: -1 where none); in the ``<eot>``
stream ``<eot>`` never follows ``<bos>`` or ``<eot>``. Greedy rows take the first maximum, as
``generate`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MASK32 = 0xFFFFFFFF
# odd multipliers below 2**31, so that a product of a 32-bit value stays inside int64
MIX_A, MIX_B, MIX_C = 0x7FEB352D, 0x046CA68B, 0x2545F491


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (int64 tensors holding values below 2**32)."""
    x = (x ^ (x >> 16)) & MASK32
    x = (x * MIX_A) & MASK32
    x = (x ^ (x >> 15)) & MASK32
    x = (x * MIX_B) & MASK32
    return (x ^ (x >> 16)) & MASK32


def uniform_noise(seed: torch.Tensor, draw: torch.Tensor, vocab: int) -> torch.Tensor:
    """(B, vocab) values in (0, 1), a function of each row's seed, its draw counter and the symbol."""
    row = mix32((seed & MASK32) ^ mix32((draw * MIX_C) & MASK32))
    symbols = torch.arange(vocab, device=seed.device, dtype=torch.int64)
    bits = mix32((row.unsqueeze(-1) * 0x9E3779B) & MASK32 ^ mix32(symbols + 1))
    return ((bits >> 8).to(torch.float32) + 0.5) / float(1 << 24)


@dataclass
class SamplingState:
    """Per-row sampling settings and counters, allocated once for the engine's slots."""

    greedy: torch.Tensor  # (B,) bool
    temperature: torch.Tensor  # (B,) float32
    top_k: torch.Tensor  # (B,) int64, 0: all
    top_p: torch.Tensor  # (B,) float32
    seed: torch.Tensor  # (B,) int64
    draw: torch.Tensor  # (B,) int64: symbols this row's request has drawn
    forced: torch.Tensor  # (B, 2) int64: the two symbols a healed byte may take (-1: free)
    last: torch.Tensor  # (B,) int64: the row's latest symbol

    @classmethod
    def allocate(cls, slots: int, device) -> SamplingState:
        def zeros(dtype, *shape):
            return torch.zeros(slots, *shape, dtype=dtype, device=device)

        return cls(
            greedy=torch.ones(slots, dtype=torch.bool, device=device),
            temperature=torch.ones(slots, dtype=torch.float32, device=device),
            top_k=zeros(torch.int64),
            top_p=torch.ones(slots, dtype=torch.float32, device=device),
            seed=zeros(torch.int64),
            draw=zeros(torch.int64),
            forced=torch.full((slots, 2), -1, dtype=torch.int64, device=device),
            last=zeros(torch.int64),
        )

    def tensors(self) -> list[torch.Tensor]:
        return [self.greedy, self.temperature, self.top_k, self.top_p, self.seed, self.draw, self.forced, self.last]


@dataclass(frozen=True)
class Rules:
    """What the stream and the folder forbid: suppressed symbols (``banned``, (V,) bool), and in
    the ``<eot>`` stream ``<eot>`` after ``<bos>`` or ``<eot>``."""

    banned: torch.Tensor
    eot: int | None
    bos: int

    @classmethod
    def of(cls, vocab: int, suppressed, eot: int | None, bos: int, device) -> Rules:
        banned = torch.zeros(vocab, dtype=torch.bool, device=device)
        banned[[s for s in suppressed if 0 <= s < vocab]] = True
        return cls(banned, eot, bos)


def allowed_scores(logits: torch.Tensor, state: SamplingState, rules: Rules) -> torch.Tensor:
    """The logits (B, V) as float32 with every symbol a row may not take at -inf."""
    scores = logits.float()
    symbols = torch.arange(scores.shape[-1], device=scores.device)
    banned = rules.banned.unsqueeze(0)
    if rules.eot is not None:
        empty = (state.last == rules.eot) | (state.last == rules.bos)
        banned = banned | (empty.unsqueeze(-1) & (symbols == rules.eot))
    healing = state.forced[:, :1] >= 0
    outside = (symbols != state.forced[:, :1]) & (symbols != state.forced[:, 1:])
    return scores.masked_fill(banned | (healing & outside), float("-inf"))


def tempered(scores: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """The scores (B, V) at each row's temperature (B,), measured from the row's best score: the best
    are 0 and the others at most 0, so that a tiny temperature (even one float32 rounds to 0) gives
    the greedy limit, the best symbols alone, where ``scores / temperature`` would overflow to
    infinities whose differences are NaN."""
    best = scores.amax(-1, keepdim=True)
    below = (scores - best) / temperature.unsqueeze(-1)  # at a temperature of 0: -inf, and 0 / 0 for the best
    return torch.where(scores == best, 0.0, below)


def choose(logits: torch.Tensor, state: SamplingState, rules: Rules, sampled: bool = True) -> torch.Tensor:
    """Each row's next symbol (B,): the greedy maximum, or a draw at the row's temperature from its
    top-k and top-p symbols; advances the rows' draw counters. ``sampled=False`` (no row samples):
    the maximum alone, without the sampling arithmetic."""
    scores = allowed_scores(logits, state, rules)
    if not sampled:
        chosen = scores.argmax(-1)
        state.draw.add_(1)
        state.last.copy_(chosen)
        return chosen
    vocab = scores.shape[-1]
    scaled = tempered(scores, state.temperature)
    ordered, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=scores.device).unsqueeze(0)
    k = torch.where(state.top_k > 0, state.top_k, vocab).unsqueeze(-1)
    probabilities = ordered.softmax(-1)
    before = probabilities.cumsum(-1) - probabilities  # the mass of the symbols ranked above
    keep_sorted = (rank < k) & ((before < state.top_p.unsqueeze(-1)) | (rank == 0))
    keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
    noise = -torch.log(-torch.log(uniform_noise(state.seed, state.draw, vocab)))
    sampled = (scaled.masked_fill(~keep, float("-inf")) + noise).argmax(-1)
    chosen = torch.where(state.greedy, scores.argmax(-1), sampled)
    state.draw.add_(1)
    state.last.copy_(chosen)
    return chosen
