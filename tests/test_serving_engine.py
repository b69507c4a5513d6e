"""The decode engine (``students/serving/engine.py``): greedy, every request gets the bytes
``generate`` gives its prompt alone (flat and patched, both streams; prompts cut inside a word and
healed; rows that join the running batch at different steps as others leave; windows that slide
past the trained context); sampling is reproducible by seed whatever shares the batch; stop
strings, cancelled requests and a full queue; the compiled step gives the eager symbols (slow)."""

from __future__ import annotations

import pytest
import torch

from bytestream.alphabet import BOS, PAD
from bytestream.stream_kind import StreamKind
from bytestream.stream_tokenizer import ByteStreamTokenizer
from students.models.patched_model import PatchedStudent, PatchedStudentConfig
from students.release.generate import GenerateOptions, generate_batch, generate_bytes
from students.serving.engine import Engine, QueueFull
from students.serving.requests import Continuation, Request, Sampling
from students.serving.sampling import Rules, SamplingState, choose
from tests.test_fused_student import fused_flat_model
from tests.test_generation import flat_model, patched_model

PROMPTS = ["In the beginning God creat", "And", "x = f(a1, b", "Let there be li"]
CONTEXT = 48  # a short trained context, so that a short answer slides past it
BUDGETS = [36, 9, 16, 12]  # the first slides past the context; the others leave early


def fused_patched_model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = PatchedStudentConfig(
        local_hidden_size=16,
        local_heads=2,
        local_intermediate_size=32,
        local_window=6,
        global_hidden_size=32,
        global_layers=2,
        global_heads=2,
        global_intermediate_size=64,
        max_position_embeddings=96,
        byte_stream="fused",
    )
    model = PatchedStudent(config).eval()
    torch.nn.init.normal_(model.global_down.weight, std=0.5)
    model.generation_config.pad_token_id = config.pad_token_id
    return model


MODELS = {
    "flat-eot": flat_model,
    "patched-eot": patched_model,
    "flat-fused": fused_flat_model,
    "patched-fused": fused_patched_model,
}


def student(name: str):
    model = MODELS[name]()
    stream = StreamKind.of_config(model.config)
    model.generation_config.suppress_tokens = [stream.bos, stream.pad]
    model.config.max_position_embeddings = CONTEXT
    return model


@pytest.fixture(scope="module")
def tokenizers(llama3_tokenizer_path):
    return {
        stream: ByteStreamTokenizer(teacher_tokenizer_file=llama3_tokenizer_path, byte_stream=stream)
        for stream in ("eot", "fused")
    }


class Collected:
    """A request's events, gathered."""

    def __init__(self):
        self.data, self.finish, self.events = bytearray(), None, []

    def __call__(self, event):
        self.events.append(event)
        self.data += event.data
        self.finish = event.finish_reason or self.finish


def request(
    tokenizer, prompt: str, budget: int, sampling: Sampling | None = None, **extra
) -> tuple[Request, Collected]:
    symbols, open_bytes = tokenizer.encode_prompt(prompt.encode())
    sink = Collected()
    return Request(
        symbols, open_bytes, budget, sampling or Sampling(), sink=sink, prompt_bytes=len(prompt.encode()), **extra
    ), sink


@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_requests_get_what_generate_gives_each_prompt_alone(name, tokenizers):
    """Four prompts on two slots: the third and fourth join as the others leave, at different steps."""
    model = student(name)
    tokenizer = tokenizers[StreamKind.of_config(model.config).value]
    made = [request(tokenizer, p, b) for p, b in zip(PROMPTS, BUDGETS)]
    engine = Engine(model, slots=2)
    engine.run([r for r, _ in made])
    # generate_batch gives each row what it gives alone (tests/test_generation.py); greedy, a smaller
    # budget gives a prefix of a larger one
    alone = generate_batch(model, tokenizer, PROMPTS, GenerateOptions(max_new_bytes=max(BUDGETS), greedy=True))
    for prompt, budget, whole, (_, sink) in zip(PROMPTS, BUDGETS, alone, made):
        assert bytes(sink.data) == whole[:budget], (name, prompt)
        assert sink.finish == ("length" if len(whole) >= budget else "stop")
    assert engine.occupancy() == {"slots": 2, "running": 0, "waiting": 0, "finished": 4, "cancelled": 0}


def test_sampling_is_reproducible_by_seed_whatever_shares_the_batch(tokenizers):
    model, tokenizer = student("patched-eot"), tokenizers["eot"]
    warm = Sampling(greedy=False, temperature=1.0, top_k=40, top_p=0.95, seed=7)
    alone, sink_alone = request(tokenizer, "And God sa", 24, warm)
    other, sink_other = request(tokenizer, "And God sa", 24, Sampling(greedy=False, temperature=1.0, seed=8))
    Engine(model, slots=2).run([alone, other])
    crowd = [request(tokenizer, p, 12, Sampling(greedy=False, seed=s)) for s, p in enumerate(PROMPTS[:2])]
    again, sink_again = request(tokenizer, "And God sa", 24, warm)
    Engine(model, slots=3).run([crowd[0][0], again, crowd[1][0]])
    assert bytes(sink_again.data) == bytes(sink_alone.data) and len(sink_alone.data) == 24
    assert bytes(sink_other.data) != bytes(sink_alone.data)
    # top-k 1 keeps only the most likely symbol: the greedy bytes
    top1, sink_top1 = request(tokenizer, "And God sa", 24, Sampling(greedy=False, temperature=0.5, top_k=1, seed=3))
    greedy, sink_greedy = request(tokenizer, "And God sa", 24)
    Engine(model, slots=2).run([top1, greedy])
    assert bytes(sink_top1.data) == bytes(sink_greedy.data)


@pytest.mark.parametrize("temperature", [1e-30, 1e-39, 1e-46, 5e-324])
def test_a_tiny_temperature_samples_the_greedy_bytes(temperature, tokenizers):
    """The limit of a temperature going to 0 is greedy: so are temperatures whose ``logits / T``
    overflows float32 (1e-39, a subnormal) or that float32 rounds to 0 (1e-46, 5e-324)."""
    model, tokenizer = student("flat-eot"), tokenizers["eot"]
    tiny, sink_tiny = request(tokenizer, "And God sa", 24, Sampling(greedy=False, temperature=temperature, seed=3))
    greedy, sink_greedy = request(tokenizer, "And God sa", 24)
    Engine(model, slots=2).run([tiny, greedy])
    assert bytes(sink_tiny.data) == bytes(sink_greedy.data) and len(sink_greedy.data) == 24


@pytest.mark.parametrize("temperature", [1e-30, 1e-39, 1e-46])
def test_a_tiny_temperature_chooses_the_best_symbol_of_logits_that_overflow_divided_by_it(temperature):
    """Logits of a trained model's size (tens), divided by 1e-39, overflow float32 to infinities:
    sampling chooses each row's best symbol all the same."""
    torch.manual_seed(0)
    logits = torch.randn(8, 300) * 10
    state = SamplingState.allocate(8, "cpu")
    state.greedy.fill_(False)
    state.temperature.fill_(temperature)
    state.seed.copy_(torch.arange(8))
    rules = Rules.of(300, [], None, BOS, "cpu")
    assert torch.equal(choose(logits, state, rules), logits.argmax(-1))


def test_a_stop_string_ends_the_request_and_is_left_out(tokenizers):
    model, tokenizer = student("flat-eot"), tokenizers["eot"]
    full, sink_full = request(tokenizer, "In the begi", 24)
    Engine(model, slots=1).run([full])
    text = bytes(sink_full.data)
    stop = text[10:13]
    first = text.find(stop)
    cut, sink_cut = request(tokenizer, "In the begi", 24, stop=(b"never there", stop))
    Engine(model, slots=1).run([cut])
    assert bytes(sink_cut.data) == text[:first] and sink_cut.finish == "stop"
    assert sink_cut.events[-1].completion_bytes == first


def test_continuation_holds_back_what_a_stop_string_may_still_claim():
    continuation = Continuation((b"END", b"xy"))
    released = []
    for byte in b"abcEN":
        continuation.add(byte)
        released.append(continuation.release(final=False))
    assert b"".join(released) == b"abc"  # "EN" may begin "END"
    continuation.add(ord("x"))
    assert continuation.release(final=False) == b"EN"  # not END; "x" may begin "xy"
    continuation.add(ord("y"))
    assert continuation.stopped and continuation.release(final=True) == b""
    assert bytes(continuation.data) == b"abcEN"


def test_a_cancelled_request_leaves_its_slot_and_a_full_queue_refuses(tokenizers):
    model, tokenizer = student("flat-eot"), tokenizers["eot"]
    engine = Engine(model, slots=1, max_queue=1)
    long, sink_long = request(tokenizer, "In the", 500)
    waiting, sink_waiting = request(tokenizer, "And", 5)
    engine.submit(long)
    engine.step()  # joins and takes a step
    engine.submit(waiting)
    with pytest.raises(QueueFull):
        engine.submit(request(tokenizer, "x", 5)[0])
    long.cancel()
    while engine.occupancy()["running"] or engine.occupancy()["waiting"]:
        engine.step()
    assert sink_long.finish is None and sink_waiting.finish is not None
    assert engine.occupancy()["cancelled"] == 1 and engine.occupancy()["finished"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ["flat-eot", "patched-fused"])
def test_the_compiled_step_gives_the_eager_symbols(name, tokenizers):
    """One graph per bucket (and per count of rows whose global model steps): the same bytes."""
    model = student(name)
    tokenizer = tokenizers[StreamKind.of_config(model.config).value]
    made = [request(tokenizer, p, 20) for p in PROMPTS[:3]]
    Engine(model, slots=2, compile=True).run([r for r, _ in made])
    for prompt, (_, sink) in zip(PROMPTS, made):
        assert bytes(sink.data) == generate_bytes(
            model, tokenizer, prompt, GenerateOptions(max_new_bytes=20, greedy=True)
        )


def test_the_engine_runs_no_prompt_of_pads_or_bos_only(tokenizers):
    """An empty prompt is ``<bos>`` alone, as ``generate`` gives it."""
    model, tokenizer = student("patched-eot"), tokenizers["eot"]
    empty, sink = request(tokenizer, "", 12)
    Engine(model, slots=1).run([empty])
    assert bytes(sink.data) == generate_bytes(model, tokenizer, "", GenerateOptions(max_new_bytes=12, greedy=True))
    assert BOS != PAD
