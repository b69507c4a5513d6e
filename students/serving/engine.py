"""The decode engine: continuous batching over a fixed set of slots, for both architectures.

Each slot holds one request. At every step boundary the engine drops the requests that finished
or were cancelled, admits waiting ones into free slots (each prompt in one forward of the model,
whose cache is copied into the slot), and runs one step for all slots: the model's step
(:mod:`students.serving.flat_step`, :mod:`students.serving.patched_step`) and the choice of each
row's next symbol (:mod:`students.serving.sampling`), one graph, compiled when asked
(``torch.compile``: inductor's C++ on the CPU, CUDA graphs on a GPU). The only per-step Python is
reading the chosen symbols back and each request's bookkeeping: its bytes, stop strings, budget,
healing of the prompt's last word, and the window that slides past the trained context as
``generate`` slides it (the last half context is run again as a prompt). Greedy, a request gets the
symbols ``generate`` gives it alone.

Waiting requests sit in a bounded queue: :meth:`Engine.submit` raises :class:`QueueFull` when it
is full. :meth:`Engine.start` runs the loop in a background thread (the server);
:meth:`Engine.run` runs it in the caller's thread until every request is done.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from bytestream.stream_kind import StreamKind
from common.errors import first_line
from students.models.decode import compile_config, warn_compiling_failed, why_not_compiled
from students.models.patched_model import PatchedStudent
from students.serving.flat_step import FlatStepper, bucket
from students.serving.patched_step import PatchedStepper
from students.serving.requests import Continuation, Event, Request
from students.serving.sampling import Rules, SamplingState, choose


class QueueFull(Exception):
    """The engine's queue of waiting requests is full."""


@dataclass
class Lane:
    """The first ``width`` slots: views of the engine's tensors that a step of that width runs on."""

    width: int
    stepper: object
    sampling: SamplingState
    positions: torch.Tensor
    active: torch.Tensor
    next_ids: torch.Tensor


@dataclass
class Row:
    """A request in a slot: what it has produced and where it stands."""

    request: Request
    history: list[int]  # every symbol of the request: its prompt window, then what it generated
    length: int = 0  # symbols in the slot's cache, plus the chosen one not yet fed
    produced: int = 0  # text symbols chosen after the prompt (the open bytes first)
    chosen: int = 0  # symbols chosen after the prompt
    continuation: Continuation = field(default=None)  # type: ignore[assignment]
    forced: bool = False  # its next symbol is constrained (a replayed symbol, a byte of the prompt's last word)
    global_entries: int = 0  # patched: the slot's global entries once its chosen symbol is fed
    finish: str | None = None


def stop_symbols(model, stream: StreamKind) -> frozenset[int]:
    """The symbols that end a request: ``<eos>`` and the generation config's end symbols (a chat
    student's end-of-turn)."""
    ids = getattr(model.generation_config, "eos_token_id", None)
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    return frozenset([stream.eos, *ids])


def model_rules(model, stream: StreamKind, device) -> Rules:
    """The symbols the folder's generation config suppresses, and the stream's own rule."""
    suppressed = list(getattr(model.generation_config, "suppress_tokens", None) or ())
    return Rules.of(model.config.vocab_size, suppressed, stream.eot, stream.bos, device)


class Engine:
    def __init__(
        self,
        model,
        *,
        slots: int = 8,
        max_queue: int = 64,
        compile: bool = False,
        stream: StreamKind | None = None,
        stop: frozenset[int] | None = None,
        every_slot: bool = False,
    ):
        self.model = model.eval()
        self.every_slot = every_slot  # every step runs all slots (compiled: no graph per narrower width)
        self.device = next(model.parameters()).device
        self.stream = stream or StreamKind.of_config(model.config)
        self.context = model.config.max_position_embeddings
        self.patched = isinstance(model, PatchedStudent)
        stepper_class = PatchedStepper if self.patched else FlatStepper
        self.stepper = stepper_class(model, slots, self.device)
        self.slots, self.max_queue = slots, max_queue
        self.rules = model_rules(model, self.stream, self.device)
        self.stop_ids = stop_symbols(model, self.stream) if stop is None else stop
        self.sampling = SamplingState.allocate(slots, self.device)
        self.positions = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.active = torch.zeros(slots, dtype=torch.bool, device=self.device)
        self.next_ids = torch.full((slots,), self.stream.pad, dtype=torch.long, device=self.device)
        self.next_closes: list[bool] = [False] * slots
        self.lanes: dict[int, Lane] = {}
        self.rows: list[Row | None] = [None] * slots
        self.pending: deque[Request] = deque()
        self.lock = threading.Condition()
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.ready = threading.Event()  # the loop runs (after any warm-up): requests are decoded
        self.warming = (0, 0)  # graphs compiled so far, of those the warm-up compiles
        self.finished = 0  # requests that ran to their end
        self.cancelled = 0  # requests dropped because their caller left
        self.graph = self._compiled_graph() if compile else self._graph
        self.compiled = self.graph != self._graph
        if self.compiled:
            self._allow_graphs()
        self.warm: set[tuple] = set()  # the compiled graphs' keys (lane width, sampled, sizes) run once
        self.byte_of = [self.stream.byte_value(s) for s in range(model.config.vocab_size)]
        self.forced_host = self.sampling.forced.numpy() if self.device.type == "cpu" else None
        if self.patched:  # whether each symbol closes a patch, looked up in Python after a step
            symbols = torch.arange(model.config.vocab_size, device=self.device)
            self.closes_of: list[bool] = model.closes(symbols).tolist()

    # ------------------------------------------------------------------ the caller's side

    def submit(self, request: Request) -> None:
        """Queue ``request``; :class:`QueueFull` when ``max_queue`` requests already wait."""
        with self.lock:
            if len(self.pending) >= self.max_queue:
                raise QueueFull(f"{len(self.pending)} requests are waiting (the queue's limit)")
            self.pending.append(request)
            self.lock.notify()

    def occupancy(self) -> dict[str, int]:
        """Busy slots, waiting requests, and the requests finished and cancelled so far."""
        with self.lock:
            running = sum(row is not None for row in self.rows)
            waiting = len(self.pending)
        return {
            "slots": self.slots,
            "running": running,
            "waiting": waiting,
            "finished": self.finished,
            "cancelled": self.cancelled,
        }

    def run(self, requests: list[Request]) -> None:
        """Run ``requests`` to the end in this thread (their sinks see every event)."""
        for request in requests:
            self.pending.append(request)
        while self.pending or any(row is not None for row in self.rows):
            self.step()

    def start(self, warm_up: list[tuple] = ()) -> None:
        """Run the loop in a background thread until :meth:`close`, first compiling the graphs of
        ``warm_up`` (:meth:`graph_keys`); :attr:`ready` is set once the loop runs."""
        if not warm_up:
            self.ready.set()
        self.thread = threading.Thread(target=self._loop, args=(list(warm_up),), name="bytedistill-engine", daemon=True)
        self.thread.start()

    def close(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify()
        if self.thread is not None:
            self.thread.join()

    def _loop(self, warm_up: list[tuple]) -> None:
        if self.compiled:
            self._allow_graphs()
        if warm_up:
            try:
                self.warm_up(warm_up)
            except Exception as error:  # noqa: BLE001 - serve anyway: the graphs left compile when first met
                print(f"warning: the warm-up stopped: {type(error).__name__}: {first_line(error)}", file=sys.stderr)
        self.ready.set()
        while True:
            with self.lock:
                while not self.stopping and not self.pending and all(row is None for row in self.rows):
                    self.lock.wait()
                if self.stopping:
                    return
            try:
                self.step()
            except Exception as error:  # noqa: BLE001 - every request hears of it; the engine goes on serving
                print(f"engine: step failed: {type(error).__name__}: {error}", file=sys.stderr)
                self._fail_all(f"{type(error).__name__}: {error}")

    # ------------------------------------------------------------------ compiling before the first request

    def graph_keys(self, entries: int | None = None) -> list[tuple]:
        """The keys (lane width, sampled, sizes) of the compiled graphs the engine can reach with
        its slots, for rows whose steps read at most ``entries`` cache entries (the flat step: the
        row's symbols; the patched one: its global entries; None: the whole context); none eagerly.
        Every lane width, greedy and sampled; a patched lane also every count of rows its global
        model steps. Ordered by the cache entries read, then the width."""
        if not self.compiled:
            return []
        capacity = self.stepper.capacity
        limit = capacity if entries is None else max(1, min(entries, capacity))
        widths = sorted({self._width([last]) for last in range(self.slots)})
        keys = []
        if not self.patched:
            for used in sorted({self._used(n) for n in range(1, limit + 1)}):
                keys += [(width, sampled, used) for width in widths for sampled in (False, True)]
            return keys
        used_by = sorted({self.stepper.global_bucket(n) for n in range(limit)})
        for used in used_by:
            for width in widths:
                counts = sorted({min(width, 1 << (count - 1).bit_length()) for count in range(1, width + 1)})
                stepping = ([0] if used == used_by[0] else []) + counts
                keys += [(width, sampled, count, used) for count in stepping for sampled in (False, True)]
        return keys

    @torch.no_grad()
    def warm_up(self, keys: list[tuple]) -> float:
        """Compile the graphs of ``keys`` (:meth:`graph_keys`) by running each once over idle slots,
        a progress bar on stderr; the engine's state is as it was after. Returns the seconds taken."""
        from tqdm.auto import tqdm

        start = time.perf_counter()
        tensors = self._state_tensors()
        saved = [tensor.clone() for tensor in tensors]
        bar = tqdm(keys, desc="compiling the decode step", unit="graph", file=sys.stderr, mininterval=1.0)
        try:
            for done, (width, sampled, *sizes) in enumerate(bar):
                if self.stopping or not self.compiled:  # closed, or compiling failed: decode eagerly
                    break
                self.warming = (done, len(keys))
                self._run_graph(self._lane(width), sampled, *sizes)
        finally:
            bar.close()
            for tensor, value in zip(tensors, saved):
                tensor.copy_(value)
        compiled = len(self.warm & set(keys))
        self.warming = (compiled, len(keys))
        seconds = time.perf_counter() - start
        print(f"compiled {compiled} graphs of the decode step in {seconds:.1f} s", file=sys.stderr, flush=True)
        return seconds

    def _state_tensors(self) -> list[torch.Tensor]:
        """Every tensor a step writes: caches, sampling state, positions, next symbols."""
        return [*self.stepper.static_tensors(), *self.sampling.tensors(), self.positions, self.active, self.next_ids]

    # ------------------------------------------------------------------ one step boundary and one step

    @torch.no_grad()
    def step(self) -> None:
        """Drop cancelled rows, admit waiting requests into free slots, then one step for all slots."""
        for slot, row in enumerate(self.rows):
            if row is not None and row.request.cancelled.is_set():
                self.cancelled += 1
                self._free(slot)
        self._admit()
        running = [slot for slot, row in enumerate(self.rows) if row is not None]
        if not running:
            return
        sampled = any(not self.rows[slot].request.sampling.greedy for slot in running)
        lane = self._lane(self._width(running))
        if self.patched:
            closing = [slot for slot in running if self.next_closes[slot]]
            chosen, closes = self._run_patched(lane, closing, sampled)
            self.next_closes[: lane.width] = closes
        else:
            longest = max(self.rows[slot].length for slot in running)
            chosen = self._run_graph(lane, sampled, self._used(longest)).tolist()
        for slot in running:
            self._take(slot, chosen[slot])

    def _width(self, running: list[int]) -> int:
        """How many slots a step runs: the first ones, up to the last busy one (requests take the
        lowest free slot), rounded up to a power of two when compiled (a graph per width)."""
        last = running[-1] + 1
        if self.every_slot:
            return self.slots
        return min(self.slots, 1 << (last - 1).bit_length()) if self.compiled else last

    def _lane(self, width: int) -> Lane:
        """The first ``width`` slots' state, as views of the engine's own tensors (made once per width)."""
        if width not in self.lanes:
            one = slice(0, width)
            stepper = self.stepper.view(width)
            sampling = SamplingState(*(tensor[one] for tensor in self.sampling.tensors()))
            lane = Lane(width, stepper, sampling, self.positions[one], self.active[one], self.next_ids[one])
            if self.compiled:  # the views a compiled step updates in place: fixed addresses too
                for tensor in [
                    *stepper.static_tensors(),
                    *sampling.tensors(),
                    lane.positions,
                    lane.active,
                    lane.next_ids,
                ]:
                    torch._dynamo.mark_static_address(tensor)
            self.lanes[width] = lane
        return self.lanes[width]

    def _run_patched(self, lane: Lane, closing: list[int], sampled: bool) -> tuple[list[int], list[bool]]:
        if not self.compiled:  # eager: the global model for exactly the closing rows
            logits = lane.stepper.eager_step(lane.next_ids, lane.positions, closing)
            chosen = self._choose_all(lane, logits, sampled)
        else:
            count = len(closing)
            stepping = min(lane.width, 1 << (count - 1).bit_length()) if count else 0
            used = self.stepper.global_bucket(max((self.rows[s].global_entries for s in closing), default=0))
            chosen = self._run_graph(lane, sampled, stepping, used)
        chosen = chosen.tolist()
        return chosen, [self.closes_of[symbol] for symbol in chosen]

    def _used(self, longest: int) -> int:
        """Cache entries the flat step reads: exactly the longest row's eagerly, a bucket compiled."""
        return bucket(longest, self.stepper.capacity) if self.compiled else longest

    def _run_graph(self, lane: Lane, sampled: bool, *args) -> torch.Tensor:
        """The (compiled) step; eagerly from now on, with one warning, where compiling fails (the
        same symbols either way: nothing ran before the compiler failed).

        A compiled graph's key (the lane, whether a row samples, the sizes) names everything its
        guards tell apart: the engine's tensors keep their addresses and shapes, the model its
        weights. So once a key has run (its guards checked in full, compiling it), later steps of
        that key check only the guards that tell the compiled graphs apart
        (``skip_guard_eval_unsafe``): most of the guards' cost per step is gone."""
        if not self.compiled:
            return self._graph(lane, sampled, *args)
        key = (lane.width, sampled, *args)
        try:
            if key in self.warm:
                with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                    return self.graph(lane, sampled, *args)
            chosen = self.graph(lane, sampled, *args)
            self.warm.add(key)
            return chosen
        except torch._dynamo.exc.BackendCompilerFailed as error:  # e.g. the C++ compiler fails
            warn_compiling_failed(error)
            self.graph, self.compiled = self._graph, False
            return self._graph(lane, sampled, *args)

    def _graph(self, lane: Lane, sampled: bool, *args) -> torch.Tensor:
        """The step of ``lane``'s slots and the choice of each one's next symbol (the function that
        is compiled; ``sampled``: some row samples)."""
        ids = lane.next_ids
        if self.patched:
            stepping, used = args
            closing = self.model.closes(ids) & lane.active
            logits = lane.stepper.step(ids, lane.positions, closing, stepping, used)
        else:
            (used,) = args
            logits = lane.stepper.step(ids, lane.positions, used)
        return self._choose_all(lane, logits, sampled)

    def _choose_all(self, lane: Lane, logits: torch.Tensor, sampled: bool) -> torch.Tensor:
        chosen = choose(logits, lane.sampling, self.rules, sampled)
        lane.positions.add_(lane.active.long())
        lane.next_ids.copy_(chosen)
        return chosen

    def _compiled_graph(self):
        reason = why_not_compiled(self.device)
        if reason is not None:
            print(f"warning: decoding eagerly: {reason}", file=sys.stderr)
            return self._graph
        options = compile_config(self.device).to_dict()
        options["dynamic"] = False  # one graph per bucket, never a symbolic length
        # CUDA graphs replay only steps whose in-place updates have fixed addresses
        for tensor in self._state_tensors():
            torch._dynamo.mark_static_address(tensor)
        return torch.compile(self._graph, **options)

    def _allow_graphs(self) -> None:
        """Let dynamo keep a graph per reachable key (its limits are per thread: called in the
        thread that compiles)."""
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, 64, len(self.graph_keys()))
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, config.recompile_limit)

    # ------------------------------------------------------------------ requests in and out of slots

    def _admit(self) -> None:
        if not self.pending:  # read without the lock: a request queued meanwhile joins at the next step
            return
        while True:
            with self.lock:
                free = next((slot for slot, row in enumerate(self.rows) if row is None), None)
                if free is None or not self.pending:
                    return
                request = self.pending.popleft()
            if request.cancelled.is_set():
                self.cancelled += 1
            else:
                self._join(free, request)

    def _join(self, slot: int, request: Request) -> None:
        sampling = request.sampling
        state = self.sampling
        state.greedy[slot] = sampling.greedy
        state.temperature[slot] = sampling.temperature
        state.top_k[slot] = sampling.top_k
        state.top_p[slot] = sampling.top_p
        state.seed[slot] = sampling.seed
        state.draw[slot] = 0
        row = Row(request, history=list(request.symbols), continuation=Continuation(request.stop))
        with self.lock:
            self.rows[slot] = row
        self._prefill(slot, row, self._window(row.history))

    def _prefill(self, slot: int, row: Row, window: list[int]) -> None:
        """Run ``window`` as the slot's context and choose the row's next symbol from its last logits."""
        if self.patched:
            logits, row.global_entries = self.stepper.prefill(slot, window)
        else:
            logits = self.stepper.prefill(slot, window)
        row.length = len(window)
        self.positions[slot] = len(window)
        self.active[slot] = True
        self.sampling.last[slot] = window[-1]
        self._set_forced(slot, row)
        one = slice(slot, slot + 1)
        view = SamplingState(*(tensor[one] for tensor in self.sampling.tensors()))
        symbol = int(choose(logits.unsqueeze(0), view, self.rules, not row.request.sampling.greedy)[0])
        self.next_ids[slot] = symbol
        if self.patched:
            self.next_closes[slot] = self.closes_of[symbol]
        self._take(slot, symbol)

    def _window(self, symbols: list[int]) -> list[int]:
        """What a row runs as its context: all of it within the trained context, else the last half
        context (where ``generate``'s window slides)."""
        return symbols if len(symbols) < self.context else symbols[-max(self.context // 2, 1) :]

    def _take(self, slot: int, symbol: int) -> None:
        """Book the row's chosen symbol: its byte, its end, the window it fills."""
        row = self.rows[slot]
        request = row.request
        row.history.append(symbol)
        row.length += 1
        row.chosen += 1
        if self.patched and self.next_closes[slot]:
            row.global_entries += 1
        value = self.byte_of[symbol] if 0 <= symbol < len(self.byte_of) else None
        if value is not None:
            row.produced += 1
            if row.produced > len(request.open_bytes):
                row.continuation.add(value)
        if row.forced:
            self._set_forced(slot, row)
        if symbol in self.stop_ids or row.continuation.stopped:
            row.finish = "stop"
        elif (
            row.produced >= len(request.open_bytes) + request.max_new_bytes
            or request.max_symbols is not None
            and row.chosen >= request.max_symbols
        ):
            row.finish = "length"
        if row.finish is not None:
            completion = len(row.continuation.data)
            last = row.continuation.release(final=True)
            self._emit(request, Event(last, row.finish, request.prompt_bytes, completion))
            self.finished += 1
            self._free(slot)
            return
        if chunk := row.continuation.release(final=False):
            self._emit(request, Event(chunk))
        if row.length >= self.context:  # the window is full: slide it, as generate does
            self._prefill(slot, row, self._window(row.history))

    def _set_forced(self, slot: int, row: Row) -> None:
        """The symbols the row's next step may take: the next one it replays, or while its prompt's
        last word is fed that byte's two symbols (any symbol once neither is left)."""
        request = row.request
        if row.chosen < len(request.replay):
            choices = [request.replay[row.chosen]] * 2
        elif row.produced < len(request.open_bytes):
            choices = self.stream.choices(request.open_bytes[row.produced])
        else:
            choices = [-1, -1]
        row.forced = choices[0] >= 0
        self._write_forced(slot, choices)

    def _write_forced(self, slot: int, choices) -> None:
        """Set the slot's two allowed symbols (on the CPU through a NumPy view of the same memory:
        no tensor made, no kernel run)."""
        if self.forced_host is not None:
            self.forced_host[slot] = choices
        else:
            self.sampling.forced[slot] = torch.tensor(choices, device=self.device)

    def _free(self, slot: int) -> None:
        with self.lock:
            self.rows[slot] = None
        self.active[slot] = False
        self.next_ids[slot] = self.stream.pad
        self.next_closes[slot] = False
        self._write_forced(slot, (-1, -1))

    def _emit(self, request: Request, event: Event) -> None:
        if request.sink is not None and (event.data or event.finish_reason):
            request.sink(event)

    def _fail_all(self, message: str) -> None:
        for slot, row in enumerate(self.rows):
            if row is not None:
                self._emit(row.request, Event(finish_reason="error", error=message))
                self._free(slot)
