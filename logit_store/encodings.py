"""Value encodings: how the per-position probabilities of a document are stored.

An encoding turns a document's values (float64 probabilities over each position's support, in
support order; ``offsets`` is the CSR of positions) into two byte arrays:

* ``value_bytes`` (S, k) uint8: k bytes per value;
* ``position_bytes`` (P, j) uint8: j bytes per position (side information, may be j = 0).

Both take each position's target (the index among the values of the symbol that actually comes
next, :func:`bytestream.stream.target_indices`): the code-table encodings keep a target that falls
in the tail at its own value (below).

The shard writer stores each column of these arrays as a separate byte plane across a whole
chunk before zstd ("byte-plane shuffling"), which is what makes them compress. Decoding gives
float32 probabilities, renormalised per position, never zero where the exact value is positive
(so KL(exact || decoded) is finite).

Encodings (see FORMAT.md for the exact formulas):

``float16``
    IEEE half-precision probabilities; values that round to 0 decode as 2**-27, but a target that
    rounds to 0 has a target tail (one per-position byte, as below).
``log8``
    8-bit log-domain codes: code c in 1..255 stands for ln p = -(255 - c) * step; values below
    the floor ln p < -254.5 * step get code 0 and decode as the mean of the exact values that
    got code 0 at that position, stored per position as a 1-byte code (-log2 mean in 1/4 steps).
``pow8`` / ``pow12`` / ``pow16``
    power-law companding: code = round(p**gamma * N) with N = 255 / 4095 / 65535; decode
    (c / N)**(1/gamma); code 0 uses the same per-position tail mean as ``log8``. gamma = 1/2
    makes the KL contribution of every value the same (Hellinger); smaller gamma spends the
    codes on the high-probability values that dominate KL (more KL-accurate, larger).
    Defaults: gamma 0.47 for ``pow8`` (and ``pow8-ans``), 0.5 for ``pow12``/``pow16``.

Target tails (every encoding, ``target_tails``, on for every store written now): where a
position's target gets code 0 (``float16``: rounds to 0), a per-position byte holds its own value on the
tail scale (-log2 p in 1/4 steps) and it decodes to that value, the tail mean being that of the
position's other code-0 values; 0 where the target has a code. A teacher near-certain of a text
and now and then wrong about its next byte gives such targets far below the tail mean: without
them the stored likelihood is not the teacher's. A store whose manifest names no
``target_tails`` was written before them and reads without (:func:`stored_encoding`).

``pow8-ans`` (the default)
    the ``pow8`` codes, entropy-coded per chunk with a static two-state rANS over up to 7725
    contexts (support symbol of the stream's alphabet, 260 or 515 × depth in the token × the code
    two values before at the position); format 2 and later.

Their sizes, KL and speeds are measured by ``python -m benchmarks.store``; the README's "Measured
figures" keeps the table.
"""

from __future__ import annotations

import functools
import math
import struct
import threading
from collections.abc import Callable
from functools import cached_property

import numpy as np

from bytestream.alphabet import FUSED_ALPHABET_SIZE
from common.errors import UserError

# The encodings' names and the default: what a config's choices (``dump --encoding``) read. This
# module loads Numba only when a kernel first runs (:func:`_kernel`), so importing it for these
# names stays light.
ENCODINGS = ("float16", "log8", "pow8", "pow8-ans", "pow12", "pow16")
DEFAULT_ENCODING = "pow8-ans"

_F16_ZERO = 2.0**-27  # a float16 that rounded to zero: somewhere in [0, 2**-25)
_TAIL_STEP = 4.0  # tail mean code: round(-log2(mean) * 4), 1..255; 0 = no positive tail


class Encoding:
    """Base class; subclasses set ``name``, ``value_width``, ``position_width``."""

    name = ""
    value_width = 0
    position_width = 0
    needs_contexts = False  # pack_values/unpack_values use the values' model contexts
    chunk_bytes = 2 << 20  # default raw bytes per chunk

    @property
    def params(self) -> dict:
        return {}

    def describe(self) -> dict:
        return {"name": self.name, "params": self.params}

    def encode(
        self, values: np.ndarray, offsets: np.ndarray, targets: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """``targets`` (P,): the index among ``values`` of each position's target, -1 where it is
        off the support (:func:`bytestream.stream.target_indices`); None: no position's target known."""
        raise NotImplementedError

    def decode(
        self,
        value_bytes: np.ndarray,
        position_bytes: np.ndarray,
        offsets: np.ndarray,
        targets: np.ndarray | None = None,
    ) -> np.ndarray:
        """Probabilities from stored bytes (``targets`` as for :meth:`encode`); ``ValueError`` for
        bytes no writer produces."""
        raise NotImplementedError

    def pack_values(self, value_bytes: np.ndarray, contexts: np.ndarray | None) -> bytes:
        """A chunk's (S, k) value bytes as stored in format 2: byte planes (zstd does the rest)."""
        return np.ascontiguousarray(value_bytes.reshape(-1, self.value_width).T).tobytes()

    def unpack_values(self, packed: memoryview, count: int, layouts: list | None, where: str) -> np.ndarray:
        """The (S, k) value bytes of a chunk's packed section (``layouts``: its documents' stream
        layouts, which the contexts of a context-coded encoding come from)."""
        if len(packed) != count * self.value_width:
            raise UserError(f"{where}: corrupt (value section of {len(packed)} bytes for {count} values)")
        planes = np.frombuffer(packed, dtype=np.uint8).reshape(self.value_width, count)
        return np.ascontiguousarray(planes.T)


class Float16Encoding(Encoding):
    """IEEE half probabilities; with ``target_tails``, one byte per position: the target's own
    value on the tail scale where it rounds to 0 (0 where it does not)."""

    name = "float16"
    value_width = 2

    def __init__(self, target_tails: bool = True):
        self.target_tails = bool(target_tails)

    @property
    def position_width(self) -> int:
        return 1 if self.target_tails else 0

    @property
    def params(self):
        return {"target_tails": True} if self.target_tails else {}

    def encode(self, values, offsets, targets=None):
        values = np.asarray(values, dtype=np.float64)
        half = values.astype(np.float16)
        side = np.zeros((len(offsets) - 1, self.position_width), np.uint8)
        if self.target_tails and targets is not None:
            targets = _targets_or_none(targets, len(offsets) - 1)
            lost = np.flatnonzero(targets >= 0)
            lost = lost[half[targets[lost]] == 0]  # positions whose target rounds to 0
            p = values[targets[lost]]
            lost, p = lost[p > 0], p[p > 0]
            side[lost, 0] = np.clip(np.round(-np.log2(p) * _TAIL_STEP), 1, 255)
        return half.view(np.uint8).reshape(-1, 2), side

    def decode(self, value_bytes, position_bytes, offsets, targets=None):
        values = np.ascontiguousarray(value_bytes).view(np.float16).reshape(-1).astype(np.float32)
        if not np.all(np.isfinite(values)) or np.any(np.signbit(values)):
            raise ValueError("a float16 value that is not a finite non-negative number")
        rounded_to_zero = values <= 0
        values[rounded_to_zero] = _F16_ZERO
        if self.target_tails:
            self._decode_target_tails(values, rounded_to_zero, np.asarray(position_bytes).reshape(-1), offsets, targets)
        return _renormalise(values, offsets)

    @staticmethod
    def _decode_target_tails(values, rounded_to_zero, target_tails, offsets, targets) -> None:
        """The targets with a target tail take its value (in place)."""
        tailed = np.flatnonzero(target_tails)
        if not len(tailed):
            return
        if targets is None:
            raise ValueError("target tails decoded without the positions' targets")
        offsets = np.asarray(offsets, np.int64)
        at = _targets_or_none(targets, len(target_tails))[tailed]
        if np.any((at < offsets[tailed]) | (at >= offsets[tailed + 1])) or not rounded_to_zero[at].all():
            raise ValueError("target tails at positions whose target is off the support or did not round to 0")
        values[at] = 2.0 ** (-target_tails[tailed].astype(np.float64) / _TAIL_STEP)


class _CodeTableEncoding(Encoding):
    """Integer codes (1 or 2 bytes) decoded through a table ``_table[code]``, with a per-position
    tail byte for code 0 and, with ``target_tails``, a second per-position byte: the target's own
    value on the tail scale where the target got code 0 (0 where it did not)."""

    value_width = 1
    target_tails = True

    @property
    def position_width(self) -> int:
        return 2 if self.target_tails else 1

    def _tail_params(self) -> dict:
        """``target_tails`` as the manifest records it: named only when on (a store written before
        target tails has none, and its description stays what it was)."""
        return {"target_tails": True} if self.target_tails else {}

    def _fill_codes(self, values, offsets, targets, codes, tails, target_tails) -> None:
        raise NotImplementedError

    def encode(self, values, offsets, targets=None):
        positions = len(offsets) - 1
        codes = np.empty(len(values), np.uint8 if self.value_width == 1 else np.uint16)
        tails = np.empty(positions, np.uint8)
        target_tails = np.zeros(positions, np.uint8)
        targets = _targets_or_none(targets if self.target_tails else None, positions)
        values = np.ascontiguousarray(values, np.float64)
        self._fill_codes(values, np.asarray(offsets, np.int64), targets, codes, tails, target_tails)
        if self.value_width == 2:
            codes = codes.astype("<u2", copy=False).view(np.uint8)
        side = np.stack([tails, target_tails], axis=1) if self.target_tails else tails.reshape(-1, 1)
        return codes.reshape(-1, self.value_width), side

    def decode(self, value_bytes, position_bytes, offsets, targets=None):
        raw = np.ascontiguousarray(value_bytes)
        codes = raw.reshape(-1) if self.value_width == 1 else raw.view("<u2").reshape(-1)
        if len(codes) and int(codes.max()) >= len(self._table):
            raise ValueError(f"value code {int(codes.max())} outside the {self.name} table of {len(self._table)}")
        side = np.ascontiguousarray(position_bytes).reshape(-1, self.position_width)
        positions = len(side)
        target_tails = np.ascontiguousarray(side[:, 1]) if self.target_tails else np.zeros(positions, np.uint8)
        if targets is None and target_tails.any():
            raise ValueError("target tails decoded without the positions' targets")
        out = np.empty(len(codes), np.float32)
        misplaced = _decode_codes(
            codes,
            np.ascontiguousarray(side[:, 0]),
            target_tails,
            _targets_or_none(targets, positions),
            np.asarray(offsets, np.int64),
            self._table,
            out,
        )
        if misplaced:
            raise ValueError(f"{misplaced} target tails at positions whose target has a code")
        return out


class LogEncoding(_CodeTableEncoding):
    """8-bit log-domain codes with a floor and a per-position tail mean."""

    name = "log8"
    value_width = 1

    def __init__(self, step: float = 0.05, target_tails: bool = True):
        if not 0 < step <= 1:
            raise UserError(f"log8 step must be in (0, 1], got {step}")
        self.step = float(step)
        self.target_tails = bool(target_tails)

    @property
    def params(self):
        return {"step": self.step} | self._tail_params()

    def _fill_codes(self, values, offsets, targets, codes, tails, target_tails):
        _encode_log(values, offsets, self.step, targets, codes, tails, target_tails)

    @cached_property
    def _table(self) -> np.ndarray:
        return np.exp(-(255 - np.arange(256)) * self.step)


class PowerEncoding(_CodeTableEncoding):
    """Codes round(p**gamma * N) in 1 or 2 bytes, with a per-position tail mean for code 0."""

    def __init__(self, bits: int = 8, gamma: float | None = None, target_tails: bool = True):
        if gamma is None:
            gamma = DEFAULT_GAMMA.get(bits, 0.5)
        if bits not in (8, 12, 16):
            raise UserError(f"power encoding bits must be 8, 12 or 16, got {bits}")
        if not 0 < gamma <= 1:
            raise UserError(f"power encoding gamma must be in (0, 1], got {gamma}")
        self.bits = int(bits)
        self.gamma = float(gamma)
        self.levels = (1 << self.bits) - 1
        self.name = f"pow{self.bits}"
        self.value_width = 1 if self.bits == 8 else 2
        self.target_tails = bool(target_tails)

    @property
    def params(self):
        return {"gamma": self.gamma} | self._tail_params()

    def _fill_codes(self, values, offsets, targets, codes, tails, target_tails):
        if self.bits != 8:
            _encode_pow(values, offsets, self.gamma, self.levels, targets, codes, tails, target_tails)
            return
        thresholds, bucket_code, first_bucket = self._code_search
        _encode_pow_searched(
            values,
            offsets,
            self.gamma,
            self.levels,
            targets,
            codes,
            tails,
            target_tails,
            thresholds,
            bucket_code,
            first_bucket,
        )

    @cached_property
    def _table(self) -> np.ndarray:
        return (np.arange(self.levels + 1) / self.levels) ** (1.0 / self.gamma)

    @cached_property
    def _code_search(self) -> tuple[np.ndarray, np.ndarray, int]:
        """What :func:`_encode_pow_searched` finds a code with: ``thresholds[c]``, about the least p
        of code c (p**gamma * levels = c - 0.5), 0 and infinity at the ends; and for every bucket of
        the float64 bits of p between the code-0 bound and 1 (its exponent and 8 bits of mantissa)
        the code of its least p, the buckets numbered from ``first_bucket``."""
        codes = np.arange(1, self.levels + 1)
        thresholds = np.concatenate([[0.0], ((codes - 0.5) / self.levels) ** (1.0 / self.gamma), [np.inf]])
        first_bucket = int(np.float64(_surely_zero(self.gamma, self.levels)).view(np.int64)) >> _BUCKET_SHIFT
        buckets = np.arange(first_bucket, (int(np.float64(1.0).view(np.int64)) >> _BUCKET_SHIFT) + 1)
        least = (buckets << _BUCKET_SHIFT).view(np.float64)
        bucket_code = np.searchsorted(thresholds, least, side="right") - 1
        return thresholds, bucket_code.astype(np.int64), first_bucket


class ContextCodedEncoding(PowerEncoding):
    """``pow8`` codes entropy-coded per chunk (format 2): static rANS (logit_store/rans.py) with
    one frequency table per context, the tables stored in the chunk. A value's context is what
    the reader knows when it decodes it: its support symbol, its position's depth in the token
    (0: a token start, 1, 2 or more) and the code of the value two before it at the same
    position (none, 0, 1–2, 3–9, ≥ 10), so that the coder's two states decode independently;
    see :meth:`contexts` and FORMAT.md."""

    needs_contexts = True
    chunk_bytes = 16 << 20  # the frequency tables are stored per chunk: large chunks amortise them
    DEPTHS = 3
    PREVIOUS = np.array([1] + [2] * 2 + [3] * 7 + [4] * 246, np.int64)  # code before → 1..4 (0: none)
    # contexts numbered over the stream's own alphabet, so an <eot> store's stay below 260 × 3 × 5;
    # the tables are sized for the widest alphabet, the fused one's (a context unused costs nothing)
    num_contexts = FUSED_ALPHABET_SIZE * DEPTHS * 5

    def __init__(self, gamma: float | None = None, target_tails: bool = True):
        super().__init__(8, DEFAULT_GAMMA[8] if gamma is None else gamma, target_tails)
        self.name = "pow8-ans"

    def contexts(self, layout, out: np.ndarray | None = None) -> np.ndarray:
        """(S,) per value: 2 × (symbol + A × min(depth, 2)) + (1 if it is its position's first
        value), with A the layout's alphabet size (260, or 515 for the fused stream); into
        ``out[:S]`` (int16) if given."""
        size = len(layout.support)
        groups = np.empty(size, np.int16) if out is None else out[:size]  # < 2 × 3 × 515
        _context_groups(
            layout.position_node, layout.offsets, layout.support, self.DEPTHS - 1, layout.base_alphabet_size, groups
        )
        return groups

    def pack_values(self, value_bytes, contexts):
        """``contexts`` (int16, :meth:`contexts`) are chained in place: the chunk's one such array."""
        from logit_store import rans

        codes = value_bytes.reshape(-1)
        full, counts = rans.chained_contexts(contexts, 5, self.PREVIOUS, codes, self.num_contexts, out=contexts)
        used = np.flatnonzero(counts.sum(axis=1))
        freq = rans.quantise(counts[used])
        dense = np.zeros((self.num_contexts, 256), np.uint16)
        dense[used] = freq
        words = rans.encode(codes, full, dense)
        planes = np.ascontiguousarray(freq.astype("<u2").view(np.uint8).reshape(-1, 2).T).tobytes()
        header = struct.pack("<I", len(used)) + used.astype("<u2").tobytes()
        return header + planes + struct.pack("<Q", len(words)) + words.astype("<u2").tobytes()

    def unpack_values(self, packed, count, layouts, where):
        try:
            return self._unpack(bytes(packed), count, layouts).reshape(-1, 1)
        except (ValueError, struct.error) as exc:
            raise UserError(f"{where}: corrupt values ({exc})") from None

    def _unpack(self, packed: bytes, count: int, layouts: list) -> np.ndarray:
        from logit_store import rans

        if sum(layout.num_values for layout in layouts) != count:
            raise ValueError(f"the documents' supports hold other than {count} values")
        # numbered over its stream's own alphabet: a reserved symbol (at the root only) shares a number
        contexts = max((layout.base_alphabet_size for layout in layouts), default=0) * self.DEPTHS * 5
        (num_used,) = struct.unpack_from("<I", packed, 0)
        at = 4 + 2 * num_used
        if num_used > contexts or at + 512 * num_used + 8 > len(packed):
            raise ValueError("frequency tables larger than the value section")
        used = np.frombuffer(packed, "<u2", num_used, 4).astype(np.int64)
        if np.any(used >= contexts) or np.any(np.diff(used) <= 0):
            raise ValueError("frequency table contexts out of order or range")
        planes = np.frombuffer(packed, np.uint8, 512 * num_used, at).reshape(2, -1)
        freq = np.ascontiguousarray(planes.T).view("<u2").reshape(num_used, 256)
        at += 512 * num_used
        (num_words,) = struct.unpack_from("<Q", packed, at)
        if at + 8 + 2 * num_words != len(packed):
            raise ValueError("rANS word count does not match the value section")
        words = np.frombuffer(packed, "<u2", num_words, at + 8).astype(np.uint16)
        decoder = rans.Decoder(words, 5, self.PREVIOUS, used, freq, self.num_contexts)
        codes, start = np.empty(count, np.uint8), 0
        groups = np.empty(max((layout.num_values for layout in layouts), default=0), np.int16)
        for layout in layouts:  # one document's contexts at a time, in one buffer: they stay in the cache
            decoder.decode(self.contexts(layout, groups), codes[start : start + layout.num_values])
            start += layout.num_values
        decoder.finish()
        return codes


_KERNELS: dict[str, tuple[Callable, dict]] = {}  # name -> (Python function, numba.njit options)
_COMPILING = threading.Lock()


def _kernel(**options) -> Callable[[Callable], Callable]:
    """Registers a module function as a Numba kernel (``numba.njit(**options)``). Until a kernel
    first runs, its module name holds a stand-in; that first call imports Numba and puts every
    registered kernel's dispatcher in its place (:func:`_compile_kernels`), so kernels calling
    kernels find dispatchers."""

    def register(func: Callable) -> Callable:
        _KERNELS[func.__name__] = (func, options)

        @functools.wraps(func)
        def first_call(*args):
            _compile_kernels()
            return globals()[func.__name__](*args)

        return first_call

    return register


def _compile_kernels() -> None:
    with _COMPILING:
        import numba

        for name, (func, options) in _KERNELS.items():
            if not isinstance(globals()[name], numba.core.dispatcher.Dispatcher):
                globals()[name] = numba.njit(**options)(func)


@_kernel(cache=True, nogil=True)
def _context_groups(position_node, offsets, support, max_depth, alphabet_size, groups):
    start = 0  # the last token-start position (node 0); position 0 counts as one
    for p in range(len(offsets) - 1):
        if position_node[p] == 0:
            start = p
        base = 2 * alphabet_size * min(p - start, max_depth)
        for at in range(offsets[p], offsets[p + 1]):  # a loop the compiler vectorises
            groups[at] = 2 * support[at] + base
        if offsets[p] < offsets[p + 1]:
            groups[offsets[p]] += 1


def _renormalise(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    sums = np.add.reduceat(values.astype(np.float64), offsets[:-1]) if len(values) else np.zeros(0)
    return (values / np.repeat(sums, np.diff(offsets))).astype(np.float32)


@_kernel(cache=True, inline="always")
def _tail_code(total, count):
    if count == 0 or total <= 0.0:
        return 0
    code = round(-math.log2(total / count) * _TAIL_STEP)
    return min(max(code, 1), 255)


@_kernel(cache=True, inline="always")
def _finish_position(values, targets, codes, tails, target_tails, i, total, count):
    """The position's tail byte (the mean of its code-0 values but its target's) and, where its
    target got code 0, the target's own value on the tail scale."""
    tails[i] = _tail_code(total, count)
    target = targets[i]
    if target >= 0 and codes[target] == 0:
        target_tails[i] = _tail_code(values[target], 1)


@_kernel(cache=True, nogil=True)
def _encode_log(values, offsets, step, targets, codes, tails, target_tails):
    for i in range(len(offsets) - 1):
        total, count = 0.0, 0
        for at in range(offsets[i], offsets[i + 1]):
            p = values[at]
            c = 0
            if p > 0.0:
                c = 255 - round(-math.log(p) / step)
                c = min(max(c, 0), 255)
            if c == 0 and at != targets[i]:
                total += p
                count += 1
            codes[at] = c
        _finish_position(values, targets, codes, tails, target_tails, i, total, count)


_BUCKET_SHIFT = 44  # a float64's bits above this: its exponent and the top 8 bits of its mantissa
_SURE = 1e-9  # relative distance from a code's threshold beyond which its search needs no power


@_kernel(cache=True, inline="always")
def _surely_zero(gamma, levels):
    """Below this, p**gamma * levels < 0.5 by a margin far beyond rounding error: code 0 without
    the (costly) power, which most values of a byte distribution need."""
    return (0.5 / levels) ** (1.0 / gamma) * (1.0 - _SURE)


@_kernel(cache=True, nogil=True)
def _encode_pow(values, offsets, gamma, levels, targets, codes, tails, target_tails):
    surely_zero = _surely_zero(gamma, levels)
    for i in range(len(offsets) - 1):
        total, count = 0.0, 0
        for at in range(offsets[i], offsets[i + 1]):
            p = values[at]
            c = 0
            if p >= surely_zero:
                c = min(round(p**gamma * levels), levels)
            if c == 0 and at != targets[i]:
                total += max(p, 0.0)
                count += 1
            codes[at] = c
        _finish_position(values, targets, codes, tails, target_tails, i, total, count)


@_kernel(cache=True, nogil=True)
def _encode_pow_searched(
    values, offsets, gamma, levels, targets, codes, tails, target_tails, thresholds, bucket_code, first_bucket
):
    """:func:`_encode_pow`'s codes, found without the power: from the code of p's bucket up to the
    threshold p is below; where p is within ``_SURE`` of a threshold, or above 1, by the power."""
    surely_zero = _surely_zero(gamma, levels)
    bits = values.view(np.int64)
    for i in range(len(offsets) - 1):
        total, count = 0.0, 0
        for at in range(offsets[i], offsets[i + 1]):
            p = values[at]
            c = 0
            if 1.0 >= p >= surely_zero:
                c = bucket_code[(bits[at] >> _BUCKET_SHIFT) - first_bucket]
                while p >= thresholds[c + 1]:
                    c += 1
                if p - thresholds[c] < _SURE * p or thresholds[c + 1] - p < _SURE * p:
                    c = min(round(p**gamma * levels), levels)
            elif p > 1.0:
                c = min(round(p**gamma * levels), levels)
            if c == 0 and at != targets[i]:
                total += max(p, 0.0)
                count += 1
            codes[at] = c
        _finish_position(values, targets, codes, tails, target_tails, i, total, count)


@_kernel(cache=True, nogil=True)
def _decode_codes(codes, tails, target_tails, targets, offsets, table, out):
    """q = table[code] (code 0: the position's tail mean; the target's own value where it has a
    target tail), renormalised per position. Returns the number of target tails whose target is
    off the support or has a code (bytes no writer produces)."""
    lookup = table.copy()  # entry 0 is each position's tail in turn: no branch per value
    misplaced = 0
    for i in range(len(offsets) - 1):
        lookup[0] = 0.0
        if tails[i] > 0:
            lookup[0] = 2.0 ** (-float(tails[i]) / _TAIL_STEP)
        total = 0.0
        for at in range(offsets[i], offsets[i + 1]):
            q = lookup[codes[at]]
            out[at] = q
            total += q
        if target_tails[i] > 0:
            target = targets[i]
            if target < offsets[i] or target >= offsets[i + 1] or codes[target] != 0:
                misplaced += 1
                continue
            q = 2.0 ** (-float(target_tails[i]) / _TAIL_STEP)
            total += q - out[target]
            out[target] = q
        if total > 0.0:
            scale = 1.0 / total
            for at in range(offsets[i], offsets[i + 1]):
                out[at] = out[at] * scale
    return misplaced


def _targets_or_none(targets: np.ndarray | None, positions: int) -> np.ndarray:
    """Each position's target index as the kernels take it (int64; -1 everywhere for None)."""
    if targets is None:
        return np.full(positions, -1, np.int64)
    targets = np.ascontiguousarray(targets, np.int64)
    if len(targets) != positions:
        raise ValueError(f"{len(targets)} targets for {positions} positions")
    return targets


def get_encoding(name: str, params: dict | None = None) -> Encoding:
    """The encoding called ``name``: one of :data:`ENCODINGS` (``float16``, ``log8``, ``pow8``, ``pow8-ans``,
    the default, ``pow12``, ``pow16``)."""
    params = dict(params or {})
    try:
        if name == "float16":
            enc: Encoding = Float16Encoding(**params)
        elif name == "log8":
            enc = LogEncoding(**params)
        elif name in ("pow8", "pow12", "pow16"):
            enc = PowerEncoding(bits=int(name[3:]), **params)
        elif name == "pow8-ans":
            enc = ContextCodedEncoding(**params)
        else:
            raise UserError(f"unknown value encoding {name!r}; choose one of {', '.join(ENCODINGS)}")
    except TypeError as exc:
        raise UserError(f"bad parameters {params} for encoding {name!r}: {exc}") from None
    return enc


DEFAULT_GAMMA = {8: 0.47, 12: 0.5, 16: 0.5}


def stored_encoding(description: dict) -> Encoding:
    """The encoding a manifest's ``encoding`` object names. One whose params do not name
    ``target_tails`` was written before target tails: it reads without them."""
    params = {"target_tails": False} | dict(description.get("params") or {})
    return get_encoding(description["name"], params)


@_kernel(cache=True, nogil=True)
def _kl_nats(exact, decoded):
    total = 0.0  # summed in order, without fast math: the same figure on every machine
    for at in range(len(exact)):
        p = exact[at]
        if p > 0.0:
            total += p * (math.log(p) - math.log(max(float(decoded[at]), 1e-300)))
    return total


def kl_bits(exact: np.ndarray, decoded: np.ndarray) -> float:
    """KL(exact || decoded) in bits summed over positions (values in support order, positions
    normalised)."""
    return float(_kl_nats(np.ascontiguousarray(exact, np.float64), np.ascontiguousarray(decoded))) / math.log(2)


def kl_bits_per_position(exact: np.ndarray, decoded: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """KL(exact || decoded) in bits at every position (values in support order)."""
    p = np.asarray(exact, np.float64)
    q = np.asarray(decoded, np.float64)
    terms = np.where(p > 0, p * (np.log(np.where(p > 0, p, 1.0)) - np.log(np.where(q > 0, q, 1e-300))), 0.0)
    return np.add.reduceat(terms, offsets[:-1]) / math.log(2) if len(p) else np.zeros(0)
