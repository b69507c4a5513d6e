"""Chat templates rendered within a budget (docs/DESIGN.md, "The render budget").

A chat template is code from a teacher's folder, a student's folder or ``--chat-template FILE``. It
renders in the sandboxed Jinja environment ``transformers`` renders chat templates in (the same
globals, filters and extensions, so the text is the same), made to count: every render has a
deadline (:data:`RENDER_SECONDS`) and a budget of characters (:data:`RENDER_CHARACTERS`) that the
values it makes are charged to, which grows with what it is given (:data:`CHARACTERS_PER_INPUT`).
The deadline is checked at every call, filter, loop item and piece of output (what a template can
repeat without bound goes through one of them); the size of a string or list that an operator
(``*``, ``+``, ``~``) or a block would make is charged before it is made, an integer argument larger
than the budget (a width, a count) is refused before the call, and what a call or filter returns is
charged after it. A render past either is refused with :class:`TemplateTooCostly`, in the caller's
thread: nothing keeps running once it is refused.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterable, Iterator
from contextvars import ContextVar

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.sandbox import ImmutableSandboxedEnvironment

from common.errors import UserError

RENDER_SECONDS = 20.0  # the longest one render may take
RENDER_CHARACTERS = 64 * 2**20  # the most characters one render may make, its output included ...
CHARACTERS_PER_INPUT = 16  # ... and this many more per character of the texts it is given
NUMBER_BITS = 2**16  # the largest integer an operator may make (a chat template counts, it does not compute)


class TemplateTooCostly(UserError):
    """A chat template that takes longer or makes more than a render's budget."""


class RenderBudget:
    """What one render has left: its deadline and its characters."""

    def __init__(self, seconds: float, characters: int):
        self.seconds, self.deadline = seconds, time.monotonic() + seconds
        self.characters, self.left = characters, characters

    def tick(self) -> None:
        """Refuse the render once its deadline has passed."""
        if time.monotonic() > self.deadline:
            raise TemplateTooCostly(
                f"the chat template takes more than {self.seconds:g} s to render one conversation (its render budget)"
            )

    def charge(self, size: int) -> None:
        """Charge ``size`` characters (or items) that the render makes; refuse it past its budget."""
        self.left -= size
        if self.left < 0:
            raise TemplateTooCostly(
                f"the chat template makes more than {self.characters:,} characters to render one conversation "
                "(its render budget)"
            )

    def refuse_large_arguments(self, args: Iterable, kwargs: dict) -> None:
        """Refuse an integer argument larger than the budget left (a width or a count to make)."""
        for value in (*args, *kwargs.values()):
            if type(value) is int and abs(value) > self.left:
                self.charge(abs(value))


_BUDGET: ContextVar[RenderBudget | None] = ContextVar("render_budget", default=None)


def _budget() -> RenderBudget:
    budget = _BUDGET.get()
    if budget is None:  # compiled templates render through render_template only
        raise RuntimeError("a budgeted chat template renders through render_template")
    return budget


def _size(value) -> int:
    """The characters (or items) a value holds, 0 for what has no length."""
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else 0


def _number_bits(value) -> int:
    return value.bit_length() if type(value) is int else 0


def _predicted_size(operator: str, left, right) -> int:
    """The characters or items ``left operator right`` would make, before it is made."""
    if operator == "*":
        for sequence, count in ((left, right), (right, left)):
            if _size(sequence) and type(count) is int:
                return _size(sequence) * max(count, 0)
    if operator == "+":
        return _size(left) + _size(right)
    if operator == "%" and isinstance(left, str):
        return len(left) + _widths(left, PERCENT_FIELD)
    return 0


PERCENT_FIELD = re.compile(r"%[-#0 +]*(\d*)(?:\.(\d+))?")  # a %-format's width and precision
BRACE_FIELD = re.compile(r"\{[^{}]*\}")  # a str.format replacement field


def _widths(text: str, field: re.Pattern) -> int:
    """The sum of the numbers in a format string's fields (their widths and precisions)."""
    return sum(int(n) for match in field.finditer(text) for n in re.findall(r"\d+", match.group()))


def _predicted_bits(operator: str, left, right) -> int:
    """The bits of the integer ``left operator right`` would make, before it is made."""
    a, b = _number_bits(left), _number_bits(right)
    if operator == "**" and type(right) is int:
        return a * max(right, 0)
    if operator == "*" and type(left) is int and type(right) is int:
        return a + b
    return max(a, b) + 1


def _predicted_call_size(function, args: tuple) -> int:
    """The characters a string's ``replace`` or ``join`` would make, before it is made; 0 for other calls."""
    method = getattr(function, "__wrapped__", function)
    text, name = getattr(method, "__self__", None), getattr(method, "__name__", "")
    if not isinstance(text, str):
        return 0
    if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
        return _replaced_size(text, *args[:3])
    if name == "join" and args and isinstance(args[0], (list, tuple)):
        items = args[0]
        return sum(_size(item) for item in items) + len(text) * max(len(items) - 1, 0)
    if name in ("format", "format_map"):
        return len(text) + _widths(text, BRACE_FIELD)
    return 0


def _replaced_size(text: str, old: str, new: str, count: int = -1) -> int:
    found = len(text) + 1 if not old else text.count(old)
    if type(count) is int and count >= 0:
        found = min(found, count)
    return len(text) + found * (len(new) - len(old))


class _CountingCodeGenerator(CodeGenerator):
    """Jinja's code generator with every loop's items counted and every ``~`` charged before it joins."""

    def visit_For(self, node: nodes.For, frame) -> None:
        counted = nodes.Call(nodes.EnvironmentAttribute("counted_items"), [node.iter], [], None, None)
        loop = nodes.For(node.target, counted, node.body, node.else_, node.test, node.recursive)
        super().visit_For(loop.set_lineno(node.lineno), frame)

    def visit_Concat(self, node: nodes.Concat, frame) -> None:
        if frame.eval_ctx.volatile or frame.eval_ctx.autoescape:
            super().visit_Concat(node, frame)
            return
        self.write("environment.counted_join((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BudgetedSandbox(ImmutableSandboxedEnvironment):
    """``transformers``' sandbox for chat templates, counting what a render does against its budget."""

    code_generator_class = _CountingCodeGenerator
    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def call(self, context, obj, /, *args, **kwargs):
        budget = _budget()
        budget.tick()
        budget.refuse_large_arguments(args, kwargs)
        budget.charge(_predicted_call_size(obj, args))
        result = super().call(context, obj, *args, **kwargs)
        budget.charge(_size(result))
        return result

    def call_binop(self, context, operator, left, right):
        budget = _budget()
        if operator == "+" and type(left) is str and type(right) is str:  # the common case: two texts joined
            budget.charge(len(left) + len(right))
            return left + right
        budget.charge(_predicted_size(operator, left, right))
        if _predicted_bits(operator, left, right) > NUMBER_BITS:
            raise TemplateTooCostly(f"the chat template makes an integer of more than {NUMBER_BITS:,} bits")
        result = super().call_binop(context, operator, left, right)
        if operator == "%":
            budget.charge(_size(result))
        return result

    def counted_items(self, iterable) -> Iterator:
        """A loop's items, the deadline checked before each."""
        budget = _budget()
        for item in iterable:
            budget.tick()
            yield item

    def counted_join(self, values: tuple) -> str:
        """``~``: the values' texts joined, charged before they are."""
        texts = [str(value) for value in values]
        _budget().charge(sum(map(len, texts)))
        return "".join(texts)

    def concat(self, parts: Iterable[str]) -> str:
        """A block's output (``{% set %}…{% endset %}``, a macro's body, a filter block), charged before it is joined."""
        parts = list(parts)
        _budget().charge(sum(map(len, parts)))
        return "".join(parts)


def _counted_filter(function):
    """A filter with the deadline checked, large integer arguments refused and its result charged."""

    @functools.wraps(function)  # keeps jinja's pass_context / pass_eval_context mark
    def counted(*args, **kwargs):
        budget = _budget()
        budget.tick()
        budget.refuse_large_arguments(args, kwargs)
        if function.__name__ == "do_replace" and len(args) >= 4 and all(isinstance(a, str) for a in args[1:4]):
            budget.charge(_replaced_size(*args[1:4], *args[4:5]))
        result = function(*args, **kwargs)
        budget.charge(_size(result))
        return result

    return counted


@functools.lru_cache(maxsize=32)
def compiled_template(source: str):
    """``source`` compiled in a :class:`BudgetedSandbox` with the options, globals, filters and
    extensions of the environment ``transformers`` compiles chat templates in."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    stock = _compile_jinja_template("").environment  # not the source: its constants would be folded there, unbudgeted
    env = BudgetedSandbox(
        trim_blocks=stock.trim_blocks,
        lstrip_blocks=stock.lstrip_blocks,
        extensions=[type(extension) for extension in stock.extensions.values()],
    )
    env.globals.update(stock.globals)
    env.filters.update({name: _counted_filter(function) for name, function in stock.filters.items()})
    return env.from_string(source)


def input_characters(value) -> int:
    """The characters of the texts in a template's variables (messages, their contents, …)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(input_characters(k) + input_characters(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return sum(map(input_characters, value))
    return 0


def render_template(source: str, **variables) -> str:
    """The chat template ``source`` rendered with ``variables`` within a render's budget (its
    output counted as it comes); :class:`TemplateTooCostly` past it."""
    template = compiled_template(source)
    characters = RENDER_CHARACTERS + CHARACTERS_PER_INPUT * input_characters(list(variables.values()))
    budget = RenderBudget(RENDER_SECONDS, characters)
    token = _BUDGET.set(budget)
    try:
        parts = []
        for part in template.generate(**variables):
            budget.tick()
            budget.charge(len(part))
            parts.append(part)
        return "".join(parts)
    finally:
        _BUDGET.reset(token)
