"""The OpenAI API's request and response shapes, as far as ``serve`` speaks it.

Requests are read by hand, field by field, so that every mistake is a 400 naming the field
(:class:`ApiError`); a field the API has but the student cannot honour (``n`` above 1, ``logprobs``,
``echo``, penalties, ``response_format`` other than text, a role other than system, user and
assistant) is refused, not ignored; a number that is not finite (``NaN``, which Python's JSON
reader takes) is refused too. ``max_tokens`` counts bytes of the continuation
(a byte student writes bytes), and so does ``usage``: ``prompt_tokens`` are the prompt's UTF-8
bytes, ``completion_tokens`` the continuation's.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass
from typing import Any

from students.serving.requests import Sampling
from students.serving.serve_options import ServeOptions

MAX_STOPS = 4
ROLES = ("system", "user", "assistant")  # the roles a chat student was distilled on (as dump --chat takes them)


class ApiError(Exception):
    """A refusal, with its HTTP status and the OpenAI error body's fields."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class Asked:
    """What one completion request asks for, checked."""

    model: str
    prompt: str | None  # /v1/completions
    messages: list[dict] | None  # /v1/chat/completions
    max_bytes: int
    sampling: Sampling
    stop: tuple[bytes, ...]
    stream: bool
    include_usage: bool


def _number(body: dict, name: str, default, low: float, high: float, *, integer: bool = False, low_open: bool = False):
    value = body.get(name)
    if value is None:
        return default
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise ApiError(400, f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}", param=name)
    if isinstance(value, float) and not math.isfinite(value):
        raise ApiError(400, f"{name} must be a finite number, got {value}", param=name)
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise ApiError(400, f"{name} must be in {bracket}{low}, {high}], got {value}", param=name)
    return value


def _flag(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, got {value!r}", param=name)
    return value


def _refuse_unsupported(body: dict) -> None:
    """Fields whose non-default values the student cannot honour."""
    if _number(body, "n", 1, 1, 1, integer=True) != 1:
        raise ApiError(400, "n must be 1", param="n")
    for name in ("logprobs", "top_logprobs", "suffix", "logit_bias", "tools", "functions"):
        if body.get(name) not in (None, False, {}, []):
            raise ApiError(400, f"{name} is not supported by this server", param=name)
    if _flag(body, "echo"):
        raise ApiError(400, "echo is not supported by this server", param="echo")
    if body.get("best_of") not in (None, 1):
        raise ApiError(400, "best_of must be 1", param="best_of")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise ApiError(400, f"{name} is not supported by this server (give 0 or leave it out)", param=name)
    if body.get("repetition_penalty") not in (None, 1, 1.0):
        raise ApiError(
            400,
            "repetition_penalty is not supported by this server (give 1 or leave it out)",
            param="repetition_penalty",
        )
    if body.get("response_format") not in (None, {"type": "text"}):
        raise ApiError(
            400, "response_format is not supported by this server (only {'type': 'text'})", param="response_format"
        )


def _stops(body: dict) -> tuple[bytes, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, "stop must be a non-empty string or a list of them", param="stop")
    if len(stops) > MAX_STOPS:
        raise ApiError(400, f"stop holds at most {MAX_STOPS} strings, got {len(stops)}", param="stop")
    try:
        return tuple(s.encode("utf-8") for s in stops)
    except UnicodeEncodeError as exc:  # a lone surrogate ("\ud800"), which JSON allows and UTF-8 does not
        raise ApiError(400, f"stop must be text: {exc.object[exc.start]!r} is a lone surrogate", param="stop") from None


def _sampling(body: dict) -> Sampling:
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)
    top_k = _number(body, "top_k", 0, 0, 1 << 30, integer=True)
    seed = _number(body, "seed", None, -(1 << 63), (1 << 63) - 1, integer=True)
    seed = secrets.randbits(32) if seed is None else seed & 0xFFFFFFFF
    if temperature == 0:
        return Sampling(greedy=True, seed=seed)
    return Sampling(greedy=False, temperature=float(temperature), top_k=top_k, top_p=float(top_p), seed=seed)


def _prompt(body: dict, options: ServeOptions) -> str:
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise ApiError(
            400, "prompt must be one string (token ids and several prompts are not supported)", param="prompt"
        )
    _check_size(len(prompt.encode("utf-8", errors="surrogatepass")), options, "prompt")
    return prompt


def _check_size(size: int, options: ServeOptions, param: str) -> None:
    if size > options.max_prompt_bytes:
        raise ApiError(
            400,
            f"the prompt is {size} bytes, more than this server takes ({options.max_prompt_bytes})",
            param=param,
            code="context_length_exceeded",
        )


def _messages(body: dict, options: ServeOptions) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list", param="messages")
    checked, size = [], 0
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError(400, f"messages[{index}] must be an object with a role", param="messages")
        if message["role"] not in ROLES:
            raise ApiError(
                400,
                f"messages[{index}].role is {message['role']!r}, not one of {', '.join(ROLES)}",
                param="messages",
            )
        content = message.get("content", "")
        if isinstance(content, list):  # content parts: text ones only
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
            ):
                raise ApiError(400, f"messages[{index}].content: only text parts are supported", param="messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ApiError(400, f"messages[{index}].content must be a string", param="messages")
        size += len(content.encode("utf-8", errors="surrogatepass"))
        checked.append({"role": message["role"], "content": content})
    _check_size(size, options, "messages")
    return checked


def read_request(body: Any, options: ServeOptions, *, chat: bool) -> Asked:
    """The request's fields, checked (:class:`ApiError` otherwise)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "model must be a string", param="model")
    _refuse_unsupported(body)
    name = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_bytes = _number(body, name, options.default_max_tokens, 1, options.max_tokens_limit, integer=True)
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    return Asked(
        model=model,
        prompt=None if chat else _prompt(body, options),
        messages=_messages(body, options) if chat else None,
        max_bytes=max_bytes,
        sampling=_sampling(body),
        stop=_stops(body),
        stream=_flag(body, "stream"),
        include_usage=_flag(stream_options, "include_usage"),
    )


# ------------------------------------------------------------------ responses


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(12)


def usage(prompt_bytes: int, completion_bytes: int) -> dict:
    return {
        "prompt_tokens": prompt_bytes,
        "completion_tokens": completion_bytes,
        "total_tokens": prompt_bytes + completion_bytes,
    }


def completion(
    response_id: str, model: str, chat: bool, text: str, finish: str | None, counts: tuple[int, int]
) -> dict:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice.update(text=text, logprobs=None)
    return {
        "id": response_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(*counts),
    }


def chunk(response_id: str, model: str, chat: bool, text: str | None, finish: str | None, first: bool = False) -> dict:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if text:
            delta["content"] = text
        choice["delta"] = delta
    else:
        choice.update(text=text or "", logprobs=None)
    return {
        "id": response_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
    }


def usage_chunk(response_id: str, model: str, chat: bool, counts: tuple[int, int]) -> dict:
    return {
        "id": response_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage(*counts),
    }
