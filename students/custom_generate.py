"""``generate`` for an exported student folder: ``export`` ships this file as
``custom_generate/generate.py``, which ``transformers`` binds as ``model.generate`` when the model
is loaded with ``from_pretrained(folder, trust_remote_code=True)`` (lm-evaluation-harness's
``trust_remote_code=True`` does so). Prompts given as complete streams (``tokenizer(text)``) are
healed first by the folder's stream tokenizer (``ByteStreamTokenizer.generate``); without
``trust_remote_code`` the stock ``generate`` runs, healing only through ``tokenizer.prompt``.
Self-contained: it imports only ``transformers``.
"""

from transformers import AutoTokenizer


def generate(model, input_ids=None, **kwargs):
    tokenizer = getattr(model, "_bytedistill_stream_tokenizer", None)
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(model.name_or_path, trust_remote_code=True)
        model._bytedistill_stream_tokenizer = tokenizer
    if input_ids is None:
        input_ids = kwargs.pop("inputs", None)
    if input_ids is None:
        return type(model).generate(model, **kwargs)
    return tokenizer.generate(model, input_ids, **kwargs)
