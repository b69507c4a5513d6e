"""``bytedistill serve`` (``students/serving/server.py``), started on 127.0.0.1 on a free port in the
test: driven by the official ``openai`` client (models, a completion that is ``generate``'s greedy
answer, streaming, stop sequences, a chat student's answer that is ``bytedistill chat``'s) and by raw HTTP for
the bad cases (malformed JSON, an unknown model, an oversized prompt and body, a missing API key,
a client that leaves mid-stream, a full queue), each answered as the API says, the server still
serving afterwards; every architecture and stream answers what the engine gives."""

from __future__ import annotations

import hmac
import logging
import socket
import threading
import time
from dataclasses import replace

import httpx
import openai
import pytest

from bytedistill.cli import main as bytedistill
from bytestream.stream_kind import StreamKind
from distill.teacher import template_budget
from students.release.export import export_student
from students.release.generate import GenerateOptions, generate_bytes
from students.serving.engine import Engine
from students.serving.openai_api import read_request
from students.serving.serve_options import ServeOptions
from students.serving.server import ServedModel, Server, listening_socket, load_served
from students.training.synthetic import SYNTHETIC_SOURCE
from students.training.trainer import train
from tests.test_chat_student import CHATML, RESERVED, chat_tokenizer, teacher  # noqa: F401 (teacher: a fixture)
from tests.test_serving_engine import MODELS, student
from tests.tiny_student import tiny_config

OPTIONS = ServeOptions(slots=2, max_queue=4, max_prompt_bytes=2048, api_key=None)
PROMPT = "In the begi"


@pytest.fixture(scope="module")
def folder(tmp_path_factory, llama3_tokenizer_path):
    root = tmp_path_factory.mktemp("served")
    train(tiny_config(root / "run", max_steps=1), SYNTHETIC_SOURCE)
    return export_student(root / "run", root / "model", teacher_tokenizer=llama3_tokenizer_path)


@pytest.fixture(scope="module")
def server(folder):
    running = Server(load_served(folder, replace(OPTIONS, model_name="tiny"))).start()
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def still_serving(server) -> None:
    response = httpx.post(f"{server.url}/v1/completions", json={"model": "tiny", "prompt": "And", "max_tokens": 3})
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] <= 3


def greedy(server, prompt: str, max_bytes: int) -> bytes:
    served = server.served
    return generate_bytes(
        served.engine.model, served.tokenizer, prompt, GenerateOptions(max_new_bytes=max_bytes, greedy=True)
    )


def test_the_openai_client_lists_the_model_and_completes_as_generate_does(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    answer = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0)
    expected = greedy(server, PROMPT, 24)
    assert answer.choices[0].text == expected.decode("utf-8", errors="replace")
    assert answer.usage.prompt_tokens == len(PROMPT) and answer.usage.completion_tokens == len(expected)
    assert answer.choices[0].finish_reason == ("length" if len(expected) == 24 else "stop")
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"


def test_a_last_word_longer_than_half_the_context_is_healed_as_generate_heals_it(server, client):
    """``generate`` heals a prompt's last word over at most half the trained context (what the window
    keeps once it slides); the server does the same, so greedy it answers what ``generate`` gives."""
    served = server.served
    half = served.engine.model.config.max_position_embeddings // 2
    prompt = "And God said " + "Let" * (half // 3 + 8)  # one word of more than half the context
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0}
    asked = read_request(body, served.options, chat=False)
    assert 0 < len(served.completion_request(asked).open_bytes) <= half
    answer = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
    assert answer.choices[0].text == greedy(server, prompt, 12).decode("utf-8", errors="replace")


def test_streaming_gives_the_same_text_in_chunks_with_usage_last(server, client):
    whole = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    chunks = list(
        client.completions.create(
            model="tiny",
            prompt=PROMPT,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == whole and len(texts) > 2
    assert chunks[-1].usage.completion_tokens == len(whole.encode())
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")


def test_a_stop_sequence_cuts_the_answer_before_it(server, client):
    whole = greedy(server, PROMPT, 24).decode("utf-8", errors="replace")
    stop = whole[8:11]
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stop=["\x00", stop])
    assert cut.choices[0].text == whole[: whole.find(stop)] and cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stop=stop, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == whole[: whole.find(stop)]


def test_a_seed_gives_the_same_sampled_answer(client):
    def sampled(seed: int) -> str:
        answer = client.completions.create(
            model="tiny", prompt="And", max_tokens=20, temperature=1.0, top_p=0.9, seed=seed
        )
        return answer.choices[0].text

    assert sampled(5) == sampled(5)


def test_chat_is_refused_where_the_folder_has_no_chat_template(server):
    messages = [{"role": "user", "content": "hi"}]
    response = httpx.post(f"{server.url}/v1/chat/completions", json={"model": "tiny", "messages": messages})
    assert response.status_code == 400 and response.json()["error"]["code"] == "no_chat_template"
    still_serving(server)


@pytest.mark.parametrize("architecture", ["flat", "patched"])
def test_chat_answers_through_the_chat_template_and_stops_at_the_end_of_turn(architecture, teacher, tmp_path):  # noqa: F811
    """A chat student (reserved symbols, ChatML template, end of turn in its generation config): the
    openai client's chat answer is ``bytedistill chat``'s greedy answer, streamed or not."""
    from students.models.architectures import architecture_named
    from students.models.shape import StudentShape
    from students.release.chat import answers

    tokenizer = chat_tokenizer(tmp_path, teacher[1], "fused")
    shape = StudentShape(stream="fused", architecture=architecture, preset="micro")
    model = architecture_named(architecture).build(shape, seq_len=64, seed=0, reserved=tuple(RESERVED)).eval()
    stream = StreamKind.FUSED
    end_of_turn = stream.alphabet_size + RESERVED.index("<|im_end|>")
    model.generation_config.eos_token_id = [stream.eos, end_of_turn]
    model.generation_config.suppress_tokens = [stream.bos, stream.pad]
    model.generation_config.pad_token_id = stream.pad
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    expected = answers(model, tokenizer, [messages], GenerateOptions(max_new_bytes=24, greedy=True))[0]
    engine = Engine(model, slots=2)
    engine.start()
    running = Server(ServedModel(engine, tokenizer, "chat", OPTIONS)).start()
    try:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
        answer = client.chat.completions.create(model="chat", messages=messages, max_tokens=24, temperature=0)
        assert answer.choices[0].message.content == expected and answer.choices[0].message.role == "assistant"
        chunks = client.chat.completions.create(
            model="chat", messages=messages, max_tokens=24, temperature=0, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    finally:
        running.stop()


def test_a_chat_template_past_its_render_budget_is_a_400_and_the_server_keeps_serving(teacher, tmp_path, monkeypatch):  # noqa: F811
    """A chat student whose template loops for hours on one message: that request is a 400 once the
    render's deadline passes (its render stopped), and the next request is answered."""
    from students.models.architectures import architecture_named
    from students.models.shape import StudentShape

    monkeypatch.setattr(template_budget, "RENDER_SECONDS", 0.5)
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    template = f"{{% if messages[-1]['content'] == 'loop' %}}{loops}{{% endif %}}{CHATML}"
    tokenizer = chat_tokenizer(tmp_path, teacher[1], "fused")
    tokenizer.chat_template = template
    shape = StudentShape(stream="fused", architecture="flat", preset="micro")
    model = architecture_named("flat").build(shape, seq_len=64, seed=0, reserved=tuple(RESERVED)).eval()
    engine = Engine(model, slots=2)
    engine.start()
    running = Server(ServedModel(engine, tokenizer, "chat", OPTIONS)).start()
    try:
        url, ask = f"{running.url}/v1/chat/completions", {"model": "chat", "max_tokens": 4}
        started = time.perf_counter()
        costly = httpx.post(url, json={**ask, "messages": [{"role": "user", "content": "loop"}]}, timeout=30)
        assert costly.status_code == 400 and time.perf_counter() - started < 10
        assert "(its render budget)" in costly.json()["error"]["message"]
        answered = httpx.post(url, json={**ask, "messages": [{"role": "user", "content": "Hi"}]}, timeout=30)
        assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["role"] == "assistant"
    finally:
        running.stop()


def test_malformed_unknown_oversized_and_unauthorised_requests_are_refused(server, folder):
    url = f"{server.url}/v1/completions"
    malformed = httpx.post(url, content=b'{"model": "tiny", "prompt": ', headers={"content-type": "application/json"})
    assert malformed.status_code == 400 and malformed.json()["error"]["code"] == "invalid_json"
    not_an_object = httpx.post(url, json=["tiny"])
    assert not_an_object.status_code == 400 and not_an_object.json()["error"]["type"] == "invalid_request_error"
    wrong_field = httpx.post(url, json={"model": "tiny", "prompt": "x", "max_tokens": "many"})
    assert wrong_field.status_code == 400 and wrong_field.json()["error"]["param"] == "max_tokens"
    unknown = httpx.post(url, json={"model": "gpt-4", "prompt": "x"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
    oversized = httpx.post(url, json={"model": "tiny", "prompt": "a" * (OPTIONS.max_prompt_bytes + 1)})
    assert oversized.status_code == 400 and oversized.json()["error"]["code"] == "context_length_exceeded"
    huge_body = httpx.post(url, content=b" " * (5 * OPTIONS.max_prompt_bytes + 70000))
    assert huge_body.status_code == 400 and huge_body.json()["error"]["code"] == "request_too_large"
    still_serving(server)
    guarded = Server(ServedModel(server.served.engine, server.served.tokenizer, "tiny", replace(OPTIONS, api_key="k")))
    guarded.start()
    try:
        refused = httpx.post(f"{guarded.url}/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        keyed = openai.OpenAI(base_url=f"{guarded.url}/v1", api_key="k", max_retries=0)
        assert keyed.completions.create(model="tiny", prompt="x", max_tokens=2).usage.completion_tokens <= 2
    finally:
        guarded.uvicorn.should_exit = True
        guarded.thread.join()


class ServerErrors(logging.Handler):
    """The server's log records of ERROR and above (an exception in the application: a traceback)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def server_errors():
    handler, logger = ServerErrors(), logging.getLogger("uvicorn.error")
    logger.addHandler(handler)
    yield handler.records
    logger.removeHandler(handler)


def test_a_deeply_nested_body_is_a_400_not_a_500(server, server_errors):
    response = httpx.post(f"{server.url}/v1/completions", content=b"[" * 60_000)  # within the body limit
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"
    assert not server_errors
    still_serving(server)


def test_a_stop_with_a_lone_surrogate_is_a_400_naming_stop(server, server_errors):
    body = b'{"model": "tiny", "prompt": "And", "max_tokens": 3, "stop": ["\\ud800"]}'
    response = httpx.post(f"{server.url}/v1/completions", content=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "stop"
    assert "surrogate" in response.json()["error"]["message"] and not server_errors
    still_serving(server)


def test_a_client_that_leaves_before_sending_its_body_is_one_line_in_the_log(server, server_errors, capsys):
    with socket.create_connection((server.host, server.port)) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100\r\n\r\n{"model": "tiny"'
        )
    deadline, err = time.monotonic() + 10, ""
    while "client left" not in err and time.monotonic() < deadline:
        time.sleep(0.05)
        err += capsys.readouterr().err
    assert err == "serve: a client left before sending its whole body (16 of 100 bytes)\n" and not server_errors
    still_serving(server)


@pytest.mark.parametrize(
    "field, value", [("temperature", "NaN"), ("top_p", "NaN"), ("temperature", "Infinity"), ("top_p", "-Infinity")]
)
def test_a_sampling_value_that_is_not_a_number_is_a_400_naming_the_field(server, field, value):
    body = f'{{"model": "tiny", "prompt": "And", "max_tokens": 3, "{field}": {value}}}'.encode()
    response = httpx.post(f"{server.url}/v1/completions", content=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == field
    still_serving(server)


def test_a_tiny_temperature_answers_the_greedy_text(server, client):
    greedy = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    for tiny in (1e-39, 1e-46, 5e-324):
        answer = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=tiny, seed=1)
        assert answer.choices[0].text == greedy, tiny


@pytest.mark.parametrize(
    "route, field, value",
    [
        ("completions", "response_format", {"type": "json_object"}),
        ("completions", "repetition_penalty", 1.3),
        ("chat/completions", "messages", [{"role": "wizard", "content": "Abracadabra"}]),
    ],
)
def test_fields_the_server_does_not_apply_are_refused(server, route, field, value):
    body = {"model": "tiny", "prompt": "And", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    response = httpx.post(f"{server.url}/v1/{route}", json={**body, field: value})
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == field and error["code"] != "no_chat_template"
    assert field in error["message"] or "wizard" in error["message"]
    applied = {"response_format": {"type": "text"}, "repetition_penalty": 1}
    assert httpx.post(f"{server.url}/v1/completions", json={**body, **applied}).status_code == 200


def test_the_api_key_is_compared_in_constant_time(server, monkeypatch):
    compared = []

    def compare_digest(a, b):
        compared.append((a, b))
        return real_compare_digest(a, b)

    real_compare_digest = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", compare_digest)
    guarded = Server(
        ServedModel(server.served.engine, server.served.tokenizer, "tiny", replace(OPTIONS, api_key="k"))
    ).start()
    try:
        url, body = f"{guarded.url}/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 2}
        for wrong in ("Bearer j", "Bearer k2", "Bearer \u00e9"):
            refused = httpx.post(url, json=body, headers={"Authorization": wrong.encode("latin-1")})
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert httpx.post(url, json=body, headers={"Authorization": "Bearer k"}).status_code == 200
        assert compared and all(b == b"Bearer k" for _, b in compared)
    finally:
        guarded.uvicorn.should_exit = True
        guarded.thread.join()


def test_a_client_that_leaves_mid_stream_frees_its_slot(server):
    engine = server.served.engine
    before = engine.occupancy()["cancelled"]
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": OPTIONS.max_tokens_limit, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    deadline = time.monotonic() + 20
    while engine.occupancy()["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.occupancy()["cancelled"] == before + 1 and engine.occupancy()["running"] == 0
    still_serving(server)


@pytest.fixture
def endless(server):
    """A server whose answers only their budgets end (2 slots, a queue of 4, 100,000 bytes a request)."""
    engine = Engine(server.served.engine.model, slots=2, max_queue=4, stop=frozenset())
    engine.start()
    options = replace(OPTIONS, max_tokens_limit=100_000)
    running = Server(ServedModel(engine, server.served.tokenizer, "tiny", options)).start()
    yield running
    running.stop()


def test_clients_that_leave_non_streamed_answers_free_their_slots_and_the_queue_at_once(endless):
    """Three clients (two running, one waiting) ask for long answers without ``stream`` and close
    their connections while the engine is writing: their slots and the queue are free within two
    seconds, long before their budgets run out."""
    engine = endless.served.engine
    body = {"model": "tiny", "prompt": "x", "max_tokens": 100_000, "temperature": 0}

    def leaving_client() -> None:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
            httpx.post(f"{endless.url}/v1/completions", json=body, timeout=3)

    clients = [threading.Thread(target=leaving_client) for _ in range(3)]
    for client in clients:
        client.start()
    deadline = time.monotonic() + 2.5
    while (engine.occupancy()["running"], engine.occupancy()["waiting"]) != (2, 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.occupancy()["running"] == 2 and engine.occupancy()["waiting"] == 1
    for client in clients:
        client.join()
    deadline = time.monotonic() + 2
    while (engine.occupancy()["running"] or engine.occupancy()["waiting"]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (
        engine.occupancy()["running"] == 0
        and engine.occupancy()["waiting"] == 0
        and engine.occupancy()["cancelled"] == 3
    )
    still_serving(endless)


def test_a_full_queue_answers_503(server):
    """One slot, a queue of one: a third request is refused while the first two are held."""
    engine = Engine(server.served.engine.model, slots=1, max_queue=1, stop=frozenset())  # only budgets end answers
    engine.start()
    busy = Server(ServedModel(engine, server.served.tokenizer, "tiny", OPTIONS)).start()
    url, long = f"{busy.url}/v1/completions", {"model": "tiny", "prompt": "x", "max_tokens": 8000, "stream": True}
    try:
        with httpx.stream("POST", url, json=long) as first, httpx.stream("POST", url, json=long) as second:
            assert first.status_code == 200 and second.status_code == 200
            assert engine.occupancy()["running"] == 1 and engine.occupancy()["waiting"] == 1
            refused = httpx.post(url, json={"model": "tiny", "prompt": "x"})
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "queue_full"
        deadline = time.monotonic() + 20
        while (engine.occupancy()["running"] or engine.occupancy()["waiting"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.post(url, json={"model": "tiny", "prompt": "x", "max_tokens": 2}).status_code == 200
    finally:
        busy.stop()


@pytest.mark.parametrize("name", list(MODELS))
def test_every_architecture_and_stream_answers_what_generate_gives(name, tokenizers):
    model = student(name)
    tokenizer = tokenizers["fused" if name.endswith("fused") else "eot"]
    engine = Engine(model, slots=2)
    engine.start()
    running = Server(ServedModel(engine, tokenizer, name, OPTIONS)).start()
    try:
        client = openai.OpenAI(base_url=f"{running.url}/v1", api_key="unused", max_retries=0)
        answer = client.completions.create(model=name, prompt=PROMPT, max_tokens=16, temperature=0).choices[0].text
        expected = generate_bytes(model, tokenizer, PROMPT, GenerateOptions(max_new_bytes=16, greedy=True))
        assert answer == expected.decode("utf-8", errors="replace")
    finally:
        running.stop()


@pytest.fixture(scope="module")
def tokenizers(llama3_tokenizer_path):
    from bytestream.stream_tokenizer import ByteStreamTokenizer

    return {
        stream: ByteStreamTokenizer(teacher_tokenizer_file=llama3_tokenizer_path, byte_stream=stream)
        for stream in ("eot", "fused")
    }


def test_serve_refuses_an_address_in_use_in_one_line(folder, capsys):
    taken = listening_socket("127.0.0.1", 0)
    taken.listen()
    try:
        assert bytedistill(["serve", str(folder), "--port", str(taken.getsockname()[1])]) == 2
    finally:
        taken.close()
    err = capsys.readouterr().err
    assert err.startswith("bytedistill serve: error: cannot listen on 127.0.0.1:") and err.count("\n") == 1
    assert ServeOptions().host == "127.0.0.1"  # by default this machine only


@pytest.mark.slow
def test_a_compiled_server_warms_up_then_answers_as_the_eager_one(server, folder, client):
    """``serve --compile``: /health says 503 ``warming`` (completions too) while the graphs of every
    batch width, greedy and sampled, compile; then 200, and answers equal the eager server's,
    greedy and sampled, with no graph compiled after the warm-up."""
    options = replace(OPTIONS, model_name="tiny", compile=True)
    compiled = Server(load_served(folder, options)).start()
    engine = compiled.served.engine
    try:
        warming = httpx.get(f"{compiled.url}/health")
        assert warming.status_code == 503 and warming.json()["status"] == "warming"
        early = httpx.post(f"{compiled.url}/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 2})
        assert early.status_code == 503 and early.json()["error"]["code"] == "warming"
        deadline = time.monotonic() + 600
        while httpx.get(f"{compiled.url}/health").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert httpx.get(f"{compiled.url}/health").json()["status"] == "ok"
        keys = set(engine.graph_keys(options.warm_up_entries))
        assert engine.warm == keys and {key[0] for key in keys} == {1, 2} and {key[1] for key in keys} == {False, True}
        fast = openai.OpenAI(base_url=f"{compiled.url}/v1", api_key="unused", max_retries=0)
        for settings in ({"temperature": 0}, {"temperature": 1.0, "seed": 3}):
            ask = {"model": "tiny", "prompt": PROMPT, "max_tokens": 24, **settings}
            assert fast.completions.create(**ask).choices[0].text == client.completions.create(**ask).choices[0].text
        assert engine.warm == keys  # nothing compiled while serving
    finally:
        compiled.stop()
