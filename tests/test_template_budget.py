"""Chat templates rendered within a budget (docs/DESIGN.md, "The render budget"): the real templates
render as ``transformers`` renders them, and a template that takes too long or makes too much is
refused in one line, before it makes it."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from common.errors import UserError
from distill.teacher import template_budget
from distill.teacher.chat import ChatTemplate
from distill.teacher.template_budget import TemplateTooCostly, render_template
from students.release.bytes_tokenizer import BytesTokenizer, bytes_chat_template, plain_tokenizer
from students.release.chat import chat_stream
from tests.gguf_teachers import smollm2_chat_template
from tests.test_chat_student import CHATML, RESERVED, chat_tokenizer, teacher  # noqa: F401 (teacher: a fixture)

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
CONVERSATIONS = [
    [{"role": "user", "content": "Où est 東京?"}],
    [
        {"role": "system", "content": "Réponds en une phrase."},
        {"role": "user", "content": "Où est 東京?"},
        {"role": "assistant", "content": "Au Japon — 日本."},
        {"role": "user", "content": "Et Zürich? 🇨🇭"},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "  spaces  and\nlines <|im_end|> "},
        {"role": "assistant", "content": "Bye."},
    ],
]
BOMBS = {
    "string times a count": "{{ 'x' * 500000000 }}",
    "list times a count": "{{ (['x'] * 500000000)|length }}",
    "doubling with ~": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling with +": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "a width": "{{ 'x'.center(500000000) }}",
    "a filter's width": "{{ 'x'|center(500000000) }}",
    "a %-format's width": "{{ '%500000000s' % 'x' }}",
    "a format's width": "{{ '{:500000000}'.format('x') }}",
    "replace": "{{ ('x' * 60000000)|replace('x', 'xxxxxxxxxx') }}",
    "a block of repeats": "{% set s = 'x' * 60000000 %}{% set y %}{% for i in range(100) %}{{ s }}{% endfor %}{% endset %}",
    "a macro's output": "{% macro m() %}{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}{% endmacro %}{{ m() }}",
    "a power": "{{ 3 ** 100000000 }}",
}


def real_templates() -> dict[str, tuple[str, str, str]]:
    """SmolLM2's (the bundled GGUF's), Llama-3's and Mistral's templates with their special texts."""
    return {
        "smollm2": (smollm2_chat_template(), "<|im_start|>", "<|im_end|>"),
        "llama3": ((TEMPLATES / "llama3_instruct.jinja").read_text(), "<|begin_of_text|>", "<|eot_id|>"),
        "mistral": ((TEMPLATES / "mistral_instruct.jinja").read_text(), "<s>", "</s>"),
    }


def transformers_rendering(source: str, bos: str, eos: str, messages: list[dict], prompt: bool) -> str:
    try:
        return render_jinja_template(
            [messages], chat_template=source, add_generation_prompt=prompt, bos_token=bos, eos_token=eos
        )[0][0]
    except Exception as exc:  # noqa: BLE001 - the template's own refusal, compared as text
        return f"refused: {exc}"


@pytest.mark.parametrize("name", ["smollm2", "llama3", "mistral"])
def test_real_templates_render_byte_identical_to_transformers(name):
    source, bos, eos = real_templates()[name]
    for messages in CONVERSATIONS:
        for prompt in (False, True):
            want = transformers_rendering(source, bos, eos, messages, prompt)
            try:
                got = ChatTemplate(source, bos, eos).render(messages, add_generation_prompt=prompt)
            except UserError as exc:
                got = f"refused: {str(exc).removeprefix('the chat template refuses it: ')}"
            assert got == want, (name, messages, prompt)


@pytest.mark.parametrize("bomb", list(BOMBS), ids=list(BOMBS))
def test_a_template_that_would_make_too_much_is_refused_before_it_makes_it(bomb):
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(TemplateTooCostly) as refused:
            render_template(BOMBS[bomb], messages=[{"role": "user", "content": "hi"}])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 5
    assert peak < 200 * 2**20, f"{peak:,} bytes allocated"
    assert "\n" not in str(refused.value) and "chat template" in str(refused.value)


def test_nested_loops_are_refused_at_the_render_deadline(monkeypatch):
    monkeypatch.setattr(template_budget, "RENDER_SECONDS", 0.5)
    started = time.perf_counter()
    with pytest.raises(TemplateTooCostly, match=r"takes more than 0\.5 s to render one conversation"):
        ChatTemplate(NESTED_LOOPS).render([{"role": "user", "content": "hi"}])
    assert time.perf_counter() - started < 2


@pytest.mark.parametrize("kind", ["fused", "eot", "bytes"])
def test_a_students_chat_stream_is_its_tokenizers_apply_chat_template(teacher, tmp_path, kind):  # noqa: F811
    """``bytedistill chat``, ``generate --chat`` and ``serve`` render through the budget and read
    the rendering as the folder's own ``apply_chat_template`` does."""
    if kind == "bytes":
        template = bytes_chat_template(CHATML, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}, "")
        tokenizer = BytesTokenizer(plain_tokenizer(RESERVED, template))
    else:
        tokenizer = chat_tokenizer(tmp_path, teacher[1], kind)
    for messages in CONVERSATIONS:
        want = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        assert chat_stream(tokenizer, messages) == want
