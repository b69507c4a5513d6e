"""``bytedistill serve``: an OpenAI-compatible HTTP server over the decode engine (Starlette + uvicorn).

Routes: ``GET /health``, ``GET /v1/models`` (and ``/v1/models/{id}``), ``POST /v1/completions``,
``POST /v1/chat/completions`` (with the folder's chat template; a folder without one answers 400).
Started with ``compile``, the engine compiles the graphs its batch widths reach before it decodes
(:meth:`~students.serving.engine.Engine.warm_up`): meanwhile ``/health`` answers 503 with the status
``warming`` (and the graphs compiled so far) and completions 503 ``warming``; then 200 ``ok``.
Prompts become the student's stream with the folder's own tokenizer, a completion prompt's last
word healed as ``generate`` heals it; answers stream as server-sent events when asked
(``stream: true``). Every refusal is an OpenAI-style error body: 400 for a malformed or oversized
request, 401 without the API key, 404 for another model, 503 when the engine's queue is full. A
client that goes away mid-answer, streamed or not, frees its slot at the next step (the server
watches for its leaving while the engine writes); one that leaves before sending its whole body is
one line on stderr.
"""

from __future__ import annotations

import asyncio
import codecs
import hmac
import json
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from common.errors import UserError
from students.release.chat import chat_stream
from students.release.generate import encode_prompt
from students.serving import openai_api as api
from students.serving.engine import Engine, QueueFull
from students.serving.openai_api import ApiError
from students.serving.requests import Event, Request
from students.serving.serve_options import ServeOptions

BODY_SLACK = 65536  # bytes a request body may hold beyond its prompt (the other fields, JSON escapes)


class ServedModel:
    """The model behind the routes: its engine, tokenizer and name."""

    def __init__(self, engine: Engine, tokenizer, name: str, options: ServeOptions):
        self.engine, self.tokenizer, self.name, self.options = engine, tokenizer, name, options
        self.chat_template = getattr(tokenizer, "chat_template", None)

    def completion_request(self, asked: api.Asked) -> Request:
        data = asked.prompt.encode("utf-8", errors="surrogatepass")
        symbols, open_bytes = encode_prompt(self.engine.model, self.tokenizer, data)
        return self._request(asked, symbols, open_bytes, len(data))

    def chat_request(self, asked: api.Asked) -> Request:
        """The conversation through the folder's chat template, ending with the assistant's header
        (as ``bytedistill chat`` renders it); a folder that is no chat student answers 400."""
        if not (getattr(self.tokenizer, "reserved_symbols", None) and self.chat_template):
            raise ApiError(
                400,
                f"model {self.name} has no chat template (it was not distilled from conversations): "
                "use /v1/completions",
                param="messages",
                code="no_chat_template",
            )
        try:
            symbols = chat_stream(self.tokenizer, asked.messages)
        except UserError as exc:  # the template's own refusal (a role it does not know, …)
            raise ApiError(400, str(exc), param="messages") from None
        return self._request(asked, symbols, b"", len(self.tokenizer.text_bytes(symbols)))

    def _request(self, asked: api.Asked, symbols: list[int], open_bytes: bytes, prompt_bytes: int) -> Request:
        return Request(
            symbols=list(symbols),
            open_bytes=open_bytes,
            max_new_bytes=asked.max_bytes,
            sampling=asked.sampling,
            stop=asked.stop,
            prompt_bytes=prompt_bytes,
        )


class AsciiJSONResponse(JSONResponse):
    """JSON with every non-ASCII character escaped: an error's message may quote a client's text,
    lone surrogates included, which UTF-8 cannot encode."""

    def render(self, content) -> bytes:
        return json.dumps(content, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(error: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if error.status == 503 else None
    return AsciiJSONResponse(error.body(), status_code=error.status, headers=headers)


async def read_json(http: HttpRequest, limit: int):
    """The request body as JSON; 400 when it is larger than ``limit`` bytes or not JSON."""
    declared = http.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(
            400,
            f"the request body is {declared} bytes, more than this server takes ({limit})",
            code="request_too_large",
        )
    body = bytearray()
    try:
        async for part in http.stream():
            body += part
            if len(body) > limit:
                raise ApiError(
                    400, f"the request body is more than this server takes ({limit} bytes)", code="request_too_large"
                )
    except ClientDisconnect:
        sent = f"{len(body)} of {declared}" if declared is not None else f"{len(body)}"
        print(f"serve: a client left before sending its whole body ({sent} bytes)", file=sys.stderr, flush=True)
        raise ApiError(400, "the client left before sending its whole body", code="client_left") from None
    try:
        return json.loads(body)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ApiError(400, f"the request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:  # arrays or objects nested deeper than the reader goes
        raise ApiError(400, "the request body is not valid JSON: it nests too deep", code="invalid_json") from None


def submit(served: ServedModel, request: Request) -> AsyncIterator[Event]:
    """Queue ``request`` (503 when the queue is full) and return its events as they come, up to the
    one that says why it finished; events that arrived while the reader was busy come as one."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Event] = asyncio.Queue()
    request.sink = lambda event: loop.call_soon_threadsafe(queue.put_nowait, event)
    if not served.engine.ready.is_set():
        raise ApiError(503, "the server is compiling its decode step; retry later", kind="server_error", code="warming")
    try:
        served.engine.submit(request)
    except QueueFull as full:
        raise ApiError(
            503, f"the server is busy: {full}; retry later", kind="server_error", code="queue_full"
        ) from None

    async def events() -> AsyncIterator[Event]:
        while True:
            event = await queue.get()
            while event.finish_reason is None and not queue.empty():  # a slow reader gets what came, at once
                later = queue.get_nowait()
                event = Event(
                    event.data + later.data,
                    later.finish_reason,
                    later.prompt_bytes,
                    later.completion_bytes,
                    later.error,
                )
            yield event
            if event.finish_reason is not None:
                return

    return events()


def build_app(served: ServedModel) -> Starlette:
    options = served.options
    body_limit = 4 * options.max_prompt_bytes + BODY_SLACK

    expected_authorization = None if options.api_key is None else f"Bearer {options.api_key}".encode()

    def authorised(http: HttpRequest) -> None:
        if expected_authorization is None:
            return
        given = http.headers.get("authorization", "").encode("latin-1")  # the header's own bytes
        if not hmac.compare_digest(given, expected_authorization):  # in constant time: no key guessed by timing
            raise ApiError(401, "a valid API key is required (Authorization: Bearer KEY)", code="invalid_api_key")

    def model_card() -> dict:
        return {"id": served.name, "object": "model", "created": 0, "owned_by": "bytedistill"}

    async def health(http: HttpRequest) -> JSONResponse:
        engine = served.engine
        if not engine.ready.is_set():  # compiling its graphs: not yet in service (a load balancer waits)
            done, total = engine.warming
            body = {"status": "warming", "model": served.name, "graphs_compiled": done, "graphs": total}
            return JSONResponse(body, status_code=503, headers={"Retry-After": "5"})
        compiled = {"graphs_compiled": len(engine.warm)} if engine.compiled else {}
        return JSONResponse({"status": "ok", "model": served.name, **engine.occupancy(), **compiled})

    async def models(http: HttpRequest) -> JSONResponse:
        try:
            authorised(http)
        except ApiError as error:
            return error_response(error)
        return JSONResponse({"object": "list", "data": [model_card()]})

    async def one_model(http: HttpRequest) -> JSONResponse:
        try:
            authorised(http)
            if http.path_params["model"] != served.name:
                raise ApiError(404, f"the model {http.path_params['model']!r} does not exist", code="model_not_found")
        except ApiError as error:
            return error_response(error)
        return JSONResponse(model_card())

    def completions(chat: bool):
        async def route(http: HttpRequest):
            try:
                authorised(http)
                asked = api.read_request(await read_json(http, body_limit), options, chat=chat)
                if asked.model != served.name:
                    raise ApiError(
                        404,
                        f"the model {asked.model!r} does not exist (this server serves {served.name!r})",
                        param="model",
                        code="model_not_found",
                    )
                build = served.chat_request if chat else served.completion_request
                request = await run_in_threadpool(build, asked)
                stream = submit(served, request)
            except ApiError as error:
                return error_response(error)
            if asked.stream:
                return StreamingResponse(
                    sse(served, asked, chat, request, stream),
                    media_type="text/event-stream",
                    headers={"Cache-Control": "no-cache"},
                )
            try:
                return await whole(http, served, chat, stream)
            finally:
                request.cancel()  # a client that left: its slot is freed at the next step

        return route

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model:path}", one_model, methods=["GET"]),
        Route("/v1/completions", completions(chat=False), methods=["POST"]),
        Route("/v1/chat/completions", completions(chat=True), methods=["POST"]),
    ]

    async def not_found(http: HttpRequest, exc) -> JSONResponse:
        return error_response(ApiError(404, f"no route {http.method} {http.url.path}", code="not_found"))

    async def not_allowed(http: HttpRequest, exc) -> JSONResponse:
        return error_response(
            ApiError(405, f"{http.method} is not allowed on {http.url.path}", code="method_not_allowed")
        )

    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_allowed})


async def whole(http: HttpRequest, served: ServedModel, chat: bool, stream) -> JSONResponse:
    """The whole answer as one JSON body; a client that leaves meanwhile is answered 499 (nobody
    reads it) as soon as it leaves, however fast the engine writes."""
    answer = asyncio.ensure_future(gather(stream))
    left = asyncio.ensure_future(client_left(http))
    try:
        await asyncio.wait({answer, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
        gone = not answer.done()
        if gone:
            answer.cancel()
    if gone:
        return JSONResponse({}, status_code=499)
    text, event = answer.result()
    if event.finish_reason == "error":
        return error_response(ApiError(500, f"decoding failed: {event.error}", kind="server_error"))
    counts = (event.prompt_bytes, event.completion_bytes)
    return JSONResponse(api.completion(api.new_id(chat), served.name, chat, text, event.finish_reason, counts))


async def gather(stream) -> tuple[str, Event]:
    """The answer's text (invalid UTF-8 replaced) and its last event."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    text, event = [], Event()
    while event.finish_reason is None:
        event = await anext(stream)
        text.append(decoder.decode(event.data))
    text.append(decoder.decode(b"", final=True))
    return "".join(text), event


async def client_left(http: HttpRequest) -> None:
    """Return once the client has closed its connection (the server's ``http.disconnect`` message;
    its body was read before, so nothing else comes)."""
    while (await http.receive())["type"] != "http.disconnect":
        pass


async def sse(served: ServedModel, asked: api.Asked, chat: bool, request: Request, stream) -> AsyncIterator[str]:
    """The answer as server-sent events: a chunk per release of bytes, the finish reason, usage
    when asked, then ``[DONE]``. A client that leaves cancels the request (Starlette cancels this
    generator when it sees the disconnect)."""
    response_id, decoder = api.new_id(chat), codecs.getincrementaldecoder("utf-8")(errors="replace")
    opening = True
    try:
        while True:
            event = await anext(stream)
            text = decoder.decode(event.data, final=event.finish_reason is not None)
            if event.finish_reason == "error":
                yield _data(api.ApiError(500, f"decoding failed: {event.error}", kind="server_error").body())
                break
            if text or opening or event.finish_reason is not None:
                yield _data(api.chunk(response_id, served.name, chat, text, event.finish_reason, first=opening))
                opening = False
            if event.finish_reason is not None:
                if asked.include_usage:
                    counts = (event.prompt_bytes, event.completion_bytes)
                    yield _data(api.usage_chunk(response_id, served.name, chat, counts))
                break
        yield "data: [DONE]\n\n"
    finally:
        request.cancel()  # a client that left: its slot is freed at the next step


def _data(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def load_served(folder: Path, options: ServeOptions) -> ServedModel:
    """The exported student on ``options.device`` behind an engine (started), with its tokenizer."""
    import torch

    from students.release.exported_folder import require_same_stream
    from students.release.generate import load_folder

    model, tokenizer = load_folder(folder)
    require_same_stream(model, tokenizer)
    model = model.to(torch.device(options.device))
    engine = Engine(model, slots=options.slots, max_queue=options.max_queue, compile=options.compile)
    engine.start(warm_up=engine.graph_keys(options.warm_up_entries))
    name = options.model_name or Path(folder).resolve().name
    return ServedModel(engine, tokenizer, name, options)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (port 0: a free one), ready for uvicorn."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


class Server:
    """uvicorn serving ``served`` on a socket of its own, in this thread (:meth:`run`) or in a
    background one (:meth:`start`, :meth:`stop`: tests and the benchmark)."""

    def __init__(self, served: ServedModel, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.served = served
        self.socket = listening_socket(host, port)
        self.host, self.port = self.socket.getsockname()[:2]
        config = uvicorn.Config(build_app(served), log_level="warning", access_log=False, lifespan="off")
        self.uvicorn = uvicorn.Server(config)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        try:
            self.uvicorn.run(sockets=[self.socket])
        finally:
            self.served.engine.close()

    def start(self) -> Server:
        self.thread = threading.Thread(target=self.uvicorn.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        while not self.uvicorn.started and self.thread.is_alive():
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        if self.thread is not None:
            self.thread.join()
        self.served.engine.close()
        self.socket.close()
