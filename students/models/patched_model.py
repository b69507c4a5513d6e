"""The ``<eot>``-patched hierarchical byte student (docs/DESIGN.md, "The patched student").

The stream ``<bos> bytes(t_1) <eot> bytes(t_2) <eot> …`` already marks where each teacher token
ends, and the student predicts those marks itself, so its patches are the teacher's tokens:

- a small **local encoder** (byte embeddings + causal layers over symbols, each attending to at
  most ``local_window`` symbols) gives every symbol a local state ``h_i``;
- a **patch** closes at each ``<eot>`` and ``<bos>``; its vector is pooled (``patch_pooling``:
  the mean, or the last) from its symbols' local states. A student of the fused stream
  (``byte_stream="fused"``: 515 symbols, each byte ``b`` inside a token ``b`` and ending it
  ``256 + b``) has no ``<eot>``: its patch closes after each byte flagged "ends" and at ``<bos>``;
- a large **global transformer**, causal over patches, steps once per closed patch; its input is a
  learned start vector followed by the closed patches, so its output ``G_k`` has read exactly the
  first ``k`` patches;
- a small **local decoder** (causal layers over symbols, same window) predicts the symbol after
  ``i`` from ``h_i + down(G_k(i))``, where ``k(i)`` counts the patches closed at positions ``≤ i``:
  at an ``<eot>`` (a flagged byte) that includes the patch it just closed.

Everything position ``i`` reads comes from symbols ``≤ i`` (the boundaries too), so the model is
causal with no lookahead, and a window that starts mid-token simply has a partial first patch.

Inference keeps a :class:`PatchedCache`, allocated once per generation: a ring of the last
``local_window`` keys/values of every local layer, the global keys/values per row (rows close
patches at different steps; the global model runs only for the rows whose new symbol closes one),
the open patch's pooled sum and each row's current global output. ``generate()`` works through
``GenerationMixin``; batches may be padded on the left (``attention_mask``): each row then runs at
its own positions, and pads are neither read nor pooled.

Self-contained on purpose: ``export`` copies this file into the model folder as
``modeling_bytedistill_patched.py`` (``AutoModelForCausalLM.from_pretrained(folder,
trust_remote_code=True)``), where bytedistill is not installed, so it imports only ``torch`` and
``transformers``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.generation import CompileConfig
from transformers.modeling_outputs import CausalLMOutputWithPast

# This file runs without the package (an export ships it), so it copies what it needs; each copy
# names its source, and tests/test_shipped_copies.py holds it to that source.
# Copied from bytestream.alphabet: ALPHABET_SIZE as NUM_SYMBOLS, EOT, BOS, EOS, PAD
NUM_SYMBOLS, EOT, BOS, EOS, PAD = 260, 256, 257, 258, 259
# Copied from bytestream.alphabet: FUSED_ALPHABET_SIZE as FUSED_NUM_SYMBOLS, FUSED_ENDS, FUSED_BOS, FUSED_EOS, FUSED_PAD
FUSED_NUM_SYMBOLS, FUSED_ENDS, FUSED_BOS, FUSED_EOS, FUSED_PAD = 515, 256, 512, 513, 514
# each stream's (alphabet size, <bos>, <eos>, <pad>, <eot>): the config's defaults for ``byte_stream``
# Copied from bytestream.stream_kind: StreamKind as STREAM_SYMBOLS
STREAM_SYMBOLS = {
    "eot": (NUM_SYMBOLS, BOS, EOS, PAD, EOT),
    "fused": (FUSED_NUM_SYMBOLS, FUSED_BOS, FUSED_EOS, FUSED_PAD, None),
}
POOLINGS = ("mean", "last")
# the output field that carries the cache back to generate(): "cache" in recent transformers
_CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


class PatchedStudentConfig(PretrainedConfig):
    model_type = "bytedistill_patched"

    def __init__(
        self,
        vocab_size: int | None = None,  # None: the stream's alphabet, as are the special ids below
        local_hidden_size: int = 128,
        local_heads: int = 4,
        local_intermediate_size: int = 384,
        encoder_layers: int = 1,
        decoder_layers: int = 1,
        local_window: int = 64,
        global_hidden_size: int = 256,
        global_layers: int = 4,
        global_heads: int = 4,
        global_intermediate_size: int = 768,
        patch_pooling: str = "mean",
        max_position_embeddings: int = 2048,
        rope_theta: float = 10000.0,
        rms_norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        pad_token_id: int | None = None,
        eot_token_id: int | None = None,
        byte_stream: str = "eot",
        **kwargs,
    ):
        if byte_stream not in STREAM_SYMBOLS:
            raise ValueError(f"byte_stream must be one of {tuple(STREAM_SYMBOLS)}, got {byte_stream!r}")
        if patch_pooling not in POOLINGS:
            raise ValueError(f"patch_pooling must be one of {POOLINGS}, got {patch_pooling!r}")
        for width, heads in ((local_hidden_size, local_heads), (global_hidden_size, global_heads)):
            if width % heads or (width // heads) % 2:
                raise ValueError(f"hidden size {width} must split into {heads} heads of an even size")
        size, bos, eos, pad, eot = STREAM_SYMBOLS[byte_stream]
        self.byte_stream = byte_stream
        self.vocab_size = size if vocab_size is None else vocab_size
        self.local_hidden_size, self.local_heads = local_hidden_size, local_heads
        self.local_intermediate_size = local_intermediate_size
        self.encoder_layers, self.decoder_layers, self.local_window = encoder_layers, decoder_layers, local_window
        self.global_hidden_size, self.global_layers, self.global_heads = global_hidden_size, global_layers, global_heads
        self.global_intermediate_size = global_intermediate_size
        self.patch_pooling = patch_pooling
        self.max_position_embeddings, self.rope_theta = max_position_embeddings, rope_theta
        self.rms_norm_eps, self.initializer_range = rms_norm_eps, initializer_range
        self.eot_token_id = eot if eot_token_id is None else eot_token_id
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(
            bos_token_id=bos if bos_token_id is None else bos_token_id,
            eos_token_id=eos if eos_token_id is None else eos_token_id,
            pad_token_id=pad if pad_token_id is None else pad_token_id,
            **kwargs,
        )


# ------------------------------------------------------------------------------ layers


def _rotation(positions: torch.Tensor, half: int, theta: float, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary cosines and sines at ``positions``: (T, half), or (B, 1, T, half) per row."""
    freqs = theta ** (-torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32).unsqueeze(-1) * freqs  # (..., T, half)
    if angles.dim() == 3:
        angles = angles.unsqueeze(1)  # per row: (B, 1, T, half)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _apply_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


def _valid_positions(valid: torch.Tensor) -> torch.Tensor:
    """Each symbol's position in its row, pads on the left not counted (pads: 0)."""
    return (valid.long().cumsum(1) - 1).clamp_min(0)


def _padded_mask(positions: torch.Tensor, valid: torch.Tensor, window: int) -> torch.Tensor:
    """(B, 1, T, T): the local mask at each row's positions, pad keys left out (a pad reads itself)."""
    mask = local_mask(positions, positions, window) & valid.unsqueeze(1)
    return (mask | torch.eye(valid.shape[1], dtype=torch.bool, device=valid.device)).unsqueeze(1)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, theta: float):
        super().__init__()
        self.heads, self.theta = heads, theta
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys, values (B, H, T, D), rotated to ``positions``."""
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        cos, sin = _rotation(positions, q.shape[-1] // 2, self.theta, q.dtype)  # once for queries and keys
        return _apply_rotation(q, cos, sin), _apply_rotation(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``mask`` (T_q, T_k) or (B, 1, T_q, T_k): True where a query may read a key."""
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        b, _, t, _ = y.shape
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, width: int, inner: int):
        super().__init__()
        self.gate = nn.Linear(width, inner, bias=False)
        self.up = nn.Linear(width, inner, bias=False)
        self.down = nn.Linear(inner, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """Pre-norm attention + SwiGLU MLP; the attention's keys/values may come from a cache."""

    def __init__(self, width: int, heads: int, inner: int, theta: float, eps: float):
        super().__init__()
        self.attention_norm = nn.RMSNorm(width, eps=eps)
        self.attention = Attention(width, heads, theta)
        self.mlp_norm = nn.RMSNorm(width, eps=eps)
        self.mlp = MLP(width, inner)

    def forward(self, x, positions, mask, keys_values=None):
        """``keys_values(k, v) -> (k_all, v_all)`` joins the new keys/values with cached ones."""
        q, k, v = self.attention.project(self.attention_norm(x), positions)
        if keys_values is not None:
            k, v = keys_values(k, v)
        x = x + self.attention.attend(q, k, v, mask)
        return x + self.mlp(self.mlp_norm(x))


def local_mask(query_positions: torch.Tensor, key_positions: torch.Tensor, window: int) -> torch.Tensor:
    """Causal, at most ``window`` keys back (the query's own included)."""
    back = query_positions.unsqueeze(-1) - key_positions.unsqueeze(-2)
    return (back >= 0) & (back < window)


# ------------------------------------------------------------------------------ cache


class PatchedCache:
    """What generation carries between steps (passed in and returned, never hidden in the model),
    allocated once: ``generate()`` makes it with ``capacity`` (its maximum length), which bounds
    the patches a row can close.

    ``local[l]``: the ring (B, H, window, D) of keys/values of local layer ``l`` (encoder layers,
    then decoder layers), slot ``s`` holding the symbol at index ``slot_index[s]`` (-1: none yet);
    ``global_k/global_v[l]`` (B, H, capacity, D) with ``global_length`` (B,) valid entries per row;
    ``pad`` (B,): each row's left pads; ``open_sum``/``open_count``: the pooled local states of each
    row's open patch; ``context`` (B, global hidden): each row's latest global output; ``seen``:
    symbols consumed (pads included), and ``step`` the same as a tensor (what a compiled step reads);
    ``steps``: the compiled step parts (:class:`CompiledSteps`) when the generation asked for them.
    """

    is_compileable = False
    is_linear = (True,)  # transformers leaves the prefill to prepare_inputs_for_generation (no slicing)

    def __init__(self, capacity: int | None = None):
        self.capacity = capacity
        self.seen = 0
        self.step: torch.Tensor | None = None
        self.steps: CompiledSteps | None = None
        self.local: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.slot_index: torch.Tensor | None = None
        self.pad: torch.Tensor | None = None
        self.global_k: list[torch.Tensor] = []
        self.global_v: list[torch.Tensor] = []
        self.global_length: torch.Tensor | None = None
        self.open_sum: torch.Tensor | None = None
        self.open_count: torch.Tensor | None = None
        self.context: torch.Tensor | None = None

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def global_steps(self) -> torch.Tensor:
        """Global steps taken per row (the start step included)."""
        return self.global_length.clone()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Row ``r`` takes what row ``beam_idx[r]`` held (beam search keeps its best beams), in place:
        every tensor keeps its address."""
        rows = [*(t for pair in self.local for t in pair), *self.global_k, *self.global_v]
        rows += [self.pad, self.global_length, self.open_sum, self.open_count, self.context]
        for tensor in rows:
            tensor.copy_(tensor.index_select(0, beam_idx.to(tensor.device)))

    def mark_static(self) -> None:
        """Tag every tensor a step updates in place as a fixed address (unguarded: no recompiles),
        as ``transformers``' static cache does: CUDA graphs replay only a step whose in-place
        updates land in such tensors (else inductor skips them: "mutated inputs")."""
        state = [self.step, self.pad, self.slot_index, self.global_length, self.open_sum, self.open_count, self.context]
        rings = [tensor for pair in self.local for tensor in pair]
        for tensor in [*state, *rings, *self.global_k, *self.global_v]:
            torch._dynamo.mark_static_address(tensor)


# ------------------------------------------------------------------------------ model


class PatchedStudent(PreTrainedModel, GenerationMixin):
    config_class = PatchedStudentConfig
    base_model_prefix = "student"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]  # noqa: RUF012 - transformers reads the class attribute

    def __init__(self, config: PatchedStudentConfig):
        super().__init__(config)
        dl, dg, theta, eps = config.local_hidden_size, config.global_hidden_size, config.rope_theta, config.rms_norm_eps

        def local_block():
            return Block(dl, config.local_heads, config.local_intermediate_size, theta, eps)

        self.embed = nn.Embedding(config.vocab_size, dl)
        self.encoder = nn.ModuleList(local_block() for _ in range(config.encoder_layers))
        self.patch_norm = nn.RMSNorm(dl, eps=eps)
        self.patch_up = nn.Linear(dl, dg, bias=False)
        self.global_start = nn.Parameter(torch.zeros(dg))
        self.global_layers = nn.ModuleList(
            Block(dg, config.global_heads, config.global_intermediate_size, theta, eps)
            for _ in range(config.global_layers)
        )
        self.global_norm = nn.RMSNorm(dg, eps=eps)
        self.global_down = nn.Linear(dg, dl, bias=False)
        self.decoder = nn.ModuleList(local_block() for _ in range(config.decoder_layers))
        self.final_norm = nn.RMSNorm(dl, eps=eps)
        self.lm_head = nn.Linear(dl, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, PatchedStudent):  # after its children
            nn.init.normal_(module.global_start, std=self.config.initializer_range)
            # Zero, so that the decoder starts from the local states alone: a random projection of the
            # normalised global output (std 0.02·√width) would bury the embeddings (std 0.02) in noise.
            nn.init.zeros_(module.global_down.weight)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its own PatchedCache

    def get_input_embeddings(self):
        return self.embed

    def set_input_embeddings(self, value):
        self.embed = value

    def closes(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Where a patch closes: at each ``<eot>`` and ``<bos>``; in the fused stream after each byte
        flagged "ends" and at ``<bos>``; in either at each reserved symbol (a teacher's chat special,
        after the stream's alphabet: one teacher token)."""
        bos = input_ids == self.config.bos_token_id
        reserved = input_ids >= STREAM_SYMBOLS[self.config.byte_stream][0]
        if self.config.byte_stream == "fused":
            return bos | reserved | ((input_ids >= FUSED_ENDS) & (input_ids < FUSED_BOS))
        return bos | reserved | (input_ids == self.config.eot_token_id)

    # --------------------------------------------------------------------------- full sequence

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: PatchedCache | None = None,
        use_cache: bool | None = None,
        labels: torch.LongTensor | None = None,
        return_dict: bool | None = None,
        past_key_values: PatchedCache | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits (B, T, vocab_size) for every position; with ``use_cache`` (or a cache given) also the cache.
        ``attention_mask`` may pad rows on the left (0s before the row's symbols)."""
        if input_ids is None:
            raise ValueError("the patched student reads input_ids (it has no inputs_embeds path)")
        cache = cache if cache is not None else past_key_values
        if cache is None and use_cache:
            cache = PatchedCache()
        if cache is not None and cache.seen > 0:
            steps = [self._step(input_ids[:, i], cache) for i in range(input_ids.shape[1])]
            logits = steps[0] if len(steps) == 1 else torch.cat(steps, dim=1)
        else:
            logits = self._full(input_ids, cache, _left_padding(attention_mask, input_ids))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: cache})

    def _full(self, input_ids: torch.Tensor, cache: PatchedCache | None, valid: torch.Tensor | None) -> torch.Tensor:
        """All positions in parallel (``valid``: False at left pads, None without any); fills an
        empty ``cache`` when given."""
        config = self.config
        b, t = input_ids.shape
        if valid is None:
            positions = torch.arange(t, device=input_ids.device)
            mask = local_mask(positions, positions, config.local_window)
            closes = self.closes(input_ids)
        else:
            positions = _valid_positions(valid)
            mask = _padded_mask(positions, valid, config.local_window)
            closes = self.closes(input_ids) & valid
        keep = _keep_last(cache, config.local_window, t)

        h = self.embed(input_ids)
        for block in self.encoder:
            h = block(h, positions, mask, keep)
        closed_by = closes.long().cumsum(1)  # patches closed at positions <= i
        patch_of = closed_by - closes.long()  # the patch position i belongs to
        num_closed = closed_by[:, -1]
        slots = int(num_closed.max()) + 1  # closed patches, then each row's open one
        sums, counts = self._pool(h, closes, patch_of, slots, valid)
        patches = self.patch_up(self.patch_norm(sums[:, :-1] / counts[:, :-1].clamp_min(1).unsqueeze(-1)))
        g = torch.cat([self.global_start.to(patches.dtype).expand(b, 1, -1), patches], dim=1)
        global_positions = torch.arange(slots, device=input_ids.device)
        causal = local_mask(global_positions, global_positions, slots)
        for block in self.global_layers:
            g = block(g, global_positions, causal, _keep_all(cache, max(slots, t + 1)))
        g = self.global_norm(g)
        context = g.gather(1, closed_by.unsqueeze(-1).expand(-1, -1, g.shape[-1]))  # G_k(i)
        x = h + self.global_down(context)
        for block in self.decoder:
            x = block(x, positions, mask, keep)
        logits = self.lm_head(self.final_norm(x))
        if cache is not None:
            rows = torch.arange(b, device=input_ids.device)
            cache.seen, cache.step = t, torch.tensor(t, device=input_ids.device)
            cache.pad = (t - valid.long().sum(1)) if valid is not None else torch.zeros_like(rows)
            index = torch.arange(max(t - config.local_window, 0), t, device=input_ids.device)
            cache.slot_index = torch.full((config.local_window,), -1, dtype=torch.long, device=input_ids.device)
            cache.slot_index[index % config.local_window] = index
            cache.global_length = num_closed + 1
            cache.open_sum, cache.open_count = sums[rows, num_closed], counts[rows, num_closed]
            cache.context = g[rows, num_closed]
            if cache.steps is not None:
                cache.mark_static()
        return logits

    def _pool(self, h, closes, patch_of, slots, valid=None):
        """Per row and patch: the pooled sum of local states and how many there are (B, slots, ·)."""
        if self.config.patch_pooling == "last":
            weights = torch.zeros_like(closes, dtype=h.dtype)
            weights[:, -1] = 1.0  # the open patch's latest state, for the cache
            weights = torch.where(closes, 1.0, weights).to(h.dtype)
        else:
            weights = torch.ones_like(closes, dtype=h.dtype)
        if valid is not None:
            weights = weights * valid.to(h.dtype)  # pads are no patch's
        b, _, d = h.shape
        sums = h.new_zeros(b, slots, d).scatter_add_(
            1, patch_of.unsqueeze(-1).expand(-1, -1, d), h * weights[..., None]
        )
        counts = weights.new_zeros(b, slots).scatter_add_(1, patch_of, weights)
        return sums, counts

    # --------------------------------------------------------------------------- one step

    @torch.no_grad()
    def _step(self, symbol: torch.Tensor, cache: PatchedCache) -> torch.Tensor:
        """Logits (B, 1, vocab_size) after one more symbol per row; updates ``cache`` in place (no
        cache tensor is allocated: the local layers write one ring slot, the global ones one entry).
        Three parts: the encoder, the global step of the rows whose symbol closes a patch, the
        decoder. Compiled (:class:`CompiledSteps`), the step is one graph whichever rows close
        (:meth:`whole_step`); eager, the global step runs for the closing rows only."""
        steps = cache.steps
        if steps is not None:
            closing = self.closes(symbol)
            count = int(closing.sum())
            stepping = min(len(closing), 1 << (count - 1).bit_length()) if count else 0
            used = _global_bucket(cache) if count else 0
            symbol = symbol.clone(memory_format=torch.contiguous_format)  # a column of the ids: strides of its own
            logits = steps.whole_step(symbol, closing, cache, stepping, used)
            cache.seen += 1
            return logits
        h, closing, where = self.encode_symbol(symbol, cache)
        rows = closing.nonzero().squeeze(-1)
        if rows.numel():
            every = rows.numel() == symbol.shape[0]
            used = int((cache.global_length if every else cache.global_length[rows]).max()) + 1
            _grow(cache, used)  # read only the global entries in use
            self.global_step(rows, cache, every, used)
        cache.seen += 1
        return self.decode_symbol(h, cache, where)

    def whole_step(
        self, symbol: torch.Tensor, closing: torch.Tensor, cache: PatchedCache, stepping: int, used: int
    ) -> torch.Tensor:
        """:meth:`_step` as one graph of fixed shapes: encoder, a global step of ``stepping`` rows
        (none: no row closes a patch) reading ``used`` entries, kept only by the rows whose symbol
        closes one (``closing``, which the caller needs anyway: :meth:`masked_global_step`), decoder."""
        h, _, where = self.encode_symbol(symbol, cache)
        if stepping:
            self.masked_global_step(closing, cache, stepping, used)
        return self.decode_symbol(h, cache, where)

    def encode_symbol(self, symbol: torch.Tensor, cache: PatchedCache):
        """The new symbol's local state (B, 1, local), whether it closes a patch (B,), and where it
        sits (its position per row, ring slot and mask, for the decoder); pools it into the open patch."""
        window = self.config.local_window
        position = (cache.step - cache.pad).unsqueeze(-1)  # (B, 1): each row's own position
        slot = (cache.step % window).view(1)  # a tensor index (index_copy_), so a compiled step reads no Python int
        cache.slot_index.index_copy_(0, slot, cache.step.view(1))
        readable = (cache.slot_index.unsqueeze(0) >= cache.pad.unsqueeze(-1)) & (cache.slot_index >= 0)
        where = (position, slot, readable[:, None, None, :])  # mask (B, 1, 1, window): the ring's symbols of this row
        h = self.embed(symbol).unsqueeze(1)
        for index, block in enumerate(self.encoder):
            h = _local_step(h, block, cache.local[index], where)
        if self.config.patch_pooling == "last":
            cache.open_sum.copy_(h[:, 0])
            cache.open_count.fill_(1.0)
        else:
            cache.open_sum.add_(h[:, 0])
            cache.open_count.add_(1.0)
        return h, self.closes(symbol), where

    def decode_symbol(self, h: torch.Tensor, cache: PatchedCache, where) -> torch.Tensor:
        """The next symbol's logits from the local state and each row's latest global output."""
        x = h + self.global_down(cache.context).unsqueeze(1)
        for index, block in enumerate(self.decoder, start=len(self.encoder)):
            x = _local_step(x, block, cache.local[index], where)
        cache.step.add_(1)
        return self.lm_head(self.final_norm(x))

    def global_step(self, rows: torch.Tensor, cache: PatchedCache, every: bool, used: int) -> None:
        """Close the open patch of ``rows`` (``every``: all of them): one global step for them only,
        reading the first ``used`` global entries of each row (masked past the row's own)."""
        context = self._global_output(rows, cache, every, used)
        cache.context[rows] = context
        cache.global_length[rows] += 1
        cache.open_sum[rows] = 0.0
        cache.open_count[rows] = 0.0

    def masked_global_step(self, closing: torch.Tensor, cache: PatchedCache, stepping: int, used: int) -> None:
        """A global step of ``stepping`` rows, every row that closes a patch (``closing``, (B,) bool)
        among them, the others filling the count (the compiled step rounds it up to a power of two,
        so that its shapes repeat): the closing rows keep its result, the others drop it. A row that
        does not close writes its keys and values into its next free global entry, which it
        overwrites before any step it keeps reads it (its next close writes the same entry first)."""
        every = stepping == len(closing)
        if every:
            rows = torch.arange(len(closing), device=closing.device)
        else:  # the closing rows first
            rows = torch.sort(closing.to(torch.int8), descending=True, stable=True).indices[:stepping]
        keep = closing[rows]
        context = self._global_output(rows, cache, every, used)
        cache.context[rows] = torch.where(keep.unsqueeze(-1), context, cache.context[rows])
        cache.global_length[rows] += keep.to(cache.global_length.dtype)
        cache.open_sum[rows] = torch.where(keep.unsqueeze(-1), 0.0, cache.open_sum[rows])
        cache.open_count[rows] = torch.where(keep, 0.0, cache.open_count[rows])

    def _global_output(self, rows: torch.Tensor, cache: PatchedCache, every: bool, used: int) -> torch.Tensor:
        """The global model's normalised output (rows, global hidden) for the open patches of
        ``rows``, each row's keys and values written at its next global position."""
        open_sum, open_count = (
            (cache.open_sum, cache.open_count) if every else (cache.open_sum[rows], cache.open_count[rows])
        )
        g = self.patch_up(self.patch_norm(open_sum / open_count.clamp_min(1).unsqueeze(-1))).unsqueeze(1)
        at = cache.global_length if every else cache.global_length[rows]  # each row's next global position
        mask = (torch.arange(used, device=g.device) <= at.unsqueeze(-1)).view(len(at), 1, 1, used)
        for index, block in enumerate(self.global_layers):
            keys, values = cache.global_k[index], cache.global_v[index]

            def join(k, v, keys=keys, values=values):
                keys[rows, :, at] = k[:, :, 0]
                values[rows, :, at] = v[:, :, 0]
                if every:  # every row steps: read in place
                    return keys[:, :, :used], values[:, :, :used]
                return keys[rows, :, :used], values[rows, :, :used]

            g = block(g, at.unsqueeze(-1), mask, join)
        return self.global_norm(g)[:, 0]

    # --------------------------------------------------------------------------- generate()

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        """One :class:`PatchedCache` for the generation, sized for its maximum length, with the
        compiled step parts when the generation asks for compilation (:meth:`compiled_steps`)."""
        given = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
        if given is None and generation_config.use_cache is not False:
            cache = PatchedCache(capacity=getattr(generation_config, "max_length", None))
            cache.steps = self.compiled_steps(generation_config)
            model_kwargs[_CACHE_FIELD] = cache

    def compiled_steps(self, generation_config) -> CompiledSteps | None:
        """The step parts compiled with the generation's ``compile_config`` (given, or the default
        one for ``cache_implementation="static"``, as stock models compile with a static cache);
        None when it asks for neither or sets ``disable_compile``. Compiled once per set of options."""
        compile_config = getattr(generation_config, "compile_config", None)
        static = getattr(generation_config, "cache_implementation", None) == "static"
        if getattr(generation_config, "disable_compile", False) or (compile_config is None and not static):
            return None
        options = (compile_config or CompileConfig()).to_dict()
        key = repr(sorted(options.items()))
        compiled = self.__dict__.setdefault("_compiled_steps", {})
        if key not in compiled:
            compiled[key] = CompiledSteps(self, options)
        return compiled[key]

    def _valid_auto_compile_criteria(self, model_kwargs, generation_config) -> bool:
        return False  # the step's parts are compiled by compiled_steps, not the whole forward

    def prepare_inputs_for_generation(
        self, input_ids, cache=None, past_key_values=None, use_cache=None, attention_mask=None, **kwargs
    ):
        """Only the symbols the cache has not consumed (all of them without a cache)."""
        cache = cache if cache is not None else past_key_values
        if cache is not None and cache.seen > 0:
            return {"input_ids": input_ids[:, cache.seen :], "use_cache": use_cache, "cache": cache}
        return {"input_ids": input_ids, "use_cache": use_cache, "cache": cache, "attention_mask": attention_mask}


def _local_step(x: torch.Tensor, block: Block, ring: tuple[torch.Tensor, torch.Tensor], where) -> torch.Tensor:
    """One symbol through a local layer: its keys/values go into the ring's slot, the query reads the ring."""
    keys, values = ring
    position, slot, mask = where

    def join(k, v):
        keys.index_copy_(2, slot, k)
        values.index_copy_(2, slot, v)
        return keys, values

    return block(x, position, mask, join)


class CompiledSteps:
    """:meth:`PatchedStudent.whole_step` through ``torch.compile(**options)``: the eager methods'
    code, so the symbols are the same. Every step is one call. When k rows close a patch, the
    global model steps for k rounded up to a power of two (at most the batch): the closing rows
    and enough others, whose results are dropped, so that the step's shapes repeat; eagerly it
    steps for the k rows alone. The cache is allocated once: the step compiles once per batch
    size, count of stepping rows (none, 1, 2, 4, … the batch) and bucket of global entries read
    (:func:`_global_bucket`)."""

    def __init__(self, model: PatchedStudent, options: dict):
        self.whole_step = torch.compile(model.whole_step, **options)


def _left_padding(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor | None:
    """Where the symbols are (B, T) when ``attention_mask`` pads rows on the left; None when it pads nothing."""
    if attention_mask is None:
        return None
    valid = attention_mask.bool()
    if bool(valid.all()):
        return None
    if bool((valid[:, :-1] & ~valid[:, 1:]).any()):
        raise ValueError("the patched student takes batches padded on the left (attention_mask 0s before a row)")
    if not bool(valid[:, -1].all()):
        raise ValueError("the patched student needs at least one symbol in every row")
    return valid


def _keep_last(cache: PatchedCache | None, window: int, length: int):
    """A key/value hook for the local layers of a full pass: the ring of the last ``window`` of each."""
    if cache is None:
        return None
    index = torch.arange(max(length - window, 0), length)

    def keep(k, v):
        ring_k = k.new_zeros(*k.shape[:2], window, k.shape[3])
        ring_v = v.new_zeros(*v.shape[:2], window, v.shape[3])
        at = index.to(k.device)
        ring_k[:, :, at % window] = k[:, :, at]
        ring_v[:, :, at % window] = v[:, :, at]
        cache.local.append((ring_k, ring_v))
        return k, v

    return keep


def _keep_all(cache: PatchedCache | None, fallback: int):
    """A key/value hook for the global layers of a full pass: all of them, in buffers of the
    cache's capacity (``fallback`` when it has none)."""
    if cache is None:
        return None

    def keep(k, v):
        capacity = max(cache.capacity or fallback, k.shape[2]) + 1
        for store, new in ((cache.global_k, k), (cache.global_v, v)):
            buffer = new.new_zeros(*new.shape[:2], capacity, new.shape[3])
            buffer[:, :, : new.shape[2]] = new
            store.append(buffer)
        return k, v

    return keep


GLOBAL_BUCKET = 64


def _global_bucket(cache: PatchedCache) -> int:
    """How many global entries a compiled global step reads: those in use rounded up to a power of
    two (at least ``GLOBAL_BUCKET``), so the step compiles once per bucket, not once per length, and
    reads at most twice the entries in use, not the whole capacity."""
    needed = int(cache.global_length.max()) + 1
    used = max(GLOBAL_BUCKET, 1 << (needed - 1).bit_length())
    capacity = cache.global_k[0].shape[2]
    if needed <= capacity:
        return min(used, capacity)
    _grow(cache, used)
    return used


def _grow(cache: PatchedCache, needed: int) -> None:
    """Room for ``needed`` global positions per row (capacity doubles; only past the planned length)."""
    capacity = cache.global_k[0].shape[2]
    if needed <= capacity:
        return
    extra = max(needed, 2 * capacity) - capacity
    for store in (cache.global_k, cache.global_v):
        for index, tensor in enumerate(store):
            store[index] = torch.cat([tensor, tensor.new_zeros(*tensor.shape[:2], extra, tensor.shape[3])], dim=2)
    if cache.steps is not None:
        cache.mark_static()
