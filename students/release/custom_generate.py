"""``generate`` for an exported student folder: ``export`` ships this file as
``custom_generate/generate.py``, which ``transformers`` binds as ``model.generate`` when the model
is loaded with ``from_pretrained(folder, trust_remote_code=True)`` (lm-evaluation-harness's
``trust_remote_code=True`` does so). Prompts given as complete streams (``tokenizer(text)``) are
healed first by the folder's stream tokenizer (``ByteStreamTokenizer.generate``); without
``trust_remote_code`` the stock ``generate`` runs, healing only through ``tokenizer.prompt``.

transformers binds it as ``functools.partial(generate, model=model)``, so the model is a keyword
and every argument the stock ``generate`` takes arrives as the caller gave it: the ids positional
(``model.generate(ids, …)``), as ``inputs=`` or ``input_ids=``, a ``GenerationConfig`` positional
or by name, a streamer. They are read with the stock signature, so each form means what it means
there. Self-contained: it imports only ``transformers``.
"""

import inspect

from transformers import AutoTokenizer, GenerationMixin

_STOCK = inspect.signature(GenerationMixin.generate)


def stock_arguments(model, args: tuple, kwargs: dict) -> dict:
    """The caller's arguments by the stock ``generate``'s names (positional ones included)."""
    bound = _STOCK.bind_partial(model, *args, **kwargs).arguments
    named = {name: value for name, value in bound.items() if name not in ("self", "kwargs")}
    return {**named, **bound.get("kwargs", {})}


def generate(*args, model, **kwargs):
    arguments = stock_arguments(model, args, kwargs)
    inputs, input_ids = arguments.pop("inputs", None), arguments.pop("input_ids", None)
    if inputs is not None and input_ids is not None:  # the stock generate's own refusal
        return type(model).generate(model, inputs, input_ids=input_ids, **arguments)
    input_ids = inputs if input_ids is None else input_ids
    if input_ids is None:
        return type(model).generate(model, **arguments)
    tokenizer = getattr(model, "_bytedistill_stream_tokenizer", None)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(model.name_or_path, trust_remote_code=True)
        model._bytedistill_stream_tokenizer = tokenizer
    return tokenizer.generate(model, input_ids, **arguments)
