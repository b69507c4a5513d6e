"""Does the teacher's checkpoint hold every weight its model needs?

``transformers`` fills a weight the checkpoint lacks with random values and only logs it, so a
checkpoint missing its MLPs (or a GGUF holding only the embedding) would be distilled as a random
model. :func:`missing_weights` compares the checkpoint's tensor names with the model its config
describes, built on the ``meta`` device (no memory for weights): a model folder through
``transformers``' own loading report on ``meta``, a GGUF file by its tensor list (the ``gguf``
package) against ``transformers``' GGUF-to-model name map. Weights tied to another (an output
layer tied to the embedding) need no tensor of their own.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from common.errors import UserError

SHOWN_NAMES = 4  # name patterns shown in a refusal


def missing_weights(model_source: str, gguf_file: str | None = None) -> list[str]:
    """The model's weight names that the checkpoint does not hold ([] for a Hub id: its files
    are not local, its loading report is checked after the load by :func:`refuse_missing`)."""
    if gguf_file:
        return _missing_in_gguf(Path(model_source) / gguf_file)
    if (Path(model_source) / "config.json").is_file():
        return _missing_in_folder(model_source)
    return []


def refuse_missing(source: str, missing) -> None:
    """One line naming the weights ``source`` lacks, if any."""
    missing = sorted(missing)
    if missing:
        raise UserError(
            f"the teacher {source} lacks {len(missing)} of its model's weights ({describe_names(missing)}): "
            "loading it would fill them with random values"
        )


def check_weights(source: str, model_source: str, gguf_file: str | None = None) -> None:
    refuse_missing(source, missing_weights(model_source, gguf_file))


def describe_names(names: list[str]) -> str:
    """Weight names with their layer numbers folded: ``model.layers.{0-31}.mlp.up_proj.weight``."""
    layers: dict[str, list[int]] = {}
    for name in names:
        numbers = [int(n) for n in re.findall(r"\.(\d+)\.", name)]
        pattern = re.sub(r"\.(\d+)\.", ".{}.", name, count=1)
        layers.setdefault(pattern, []).extend(numbers[:1])
    shown = []
    for pattern, numbers in list(layers.items())[:SHOWN_NAMES]:
        if numbers:
            span = f"{min(numbers)}" if len(set(numbers)) == 1 else f"{min(numbers)}-{max(numbers)}"
            pattern = pattern.replace("{}", "{" + span + "}")
        shown.append(pattern)
    more = len(layers) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def _missing_in_folder(folder: str) -> list[str]:
    from transformers import AutoModelForCausalLM

    try:
        with _quiet_transformers():
            _, info = AutoModelForCausalLM.from_pretrained(
                folder, device_map="meta", output_loading_info=True, use_kernels=False
            )
    except Exception:  # noqa: BLE001 - the real load reports an unloadable folder in its own words
        return []
    return sorted(set(info.get("missing_keys", ())) | {str(k[0]) for k in info.get("mismatched_keys", ())})


def _missing_in_gguf(path: Path) -> list[str]:
    import gguf
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # noqa: BLE001 - the reader raises several types for a bad file
        raise UserError(f"{path} is not a readable GGUF file ({str(exc).splitlines()[0]})") from None
    try:
        config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
        processor = TENSOR_PROCESSORS.get(config.model_type, TensorProcessor)(config=config.to_dict())
        with one_tensor_name_map():
            to_model = get_gguf_hf_weights_map(model, processor)
    except Exception:  # noqa: BLE001 - an architecture transformers cannot build: the real load says so
        return []
    held = {to_model[t.name] for t in reader.tensors if t.name in to_model}
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    return sorted(set(model.state_dict()) - held - tied)


@contextmanager
def one_tensor_name_map():
    """``transformers``' GGUF name map builds gguf's ``TensorNameMap`` once per submodule (about
    800 times for a 30-layer model, most of a GGUF load's CPU time); within this context it is built
    once per architecture and layer count, and shared (it is only read)."""
    import gguf

    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = lru_cache(maxsize=None)(original)
    try:
        yield
    finally:
        gguf.get_tensor_name_map = original


@contextmanager
def one_gguf_reader():
    """Within this context a GGUF file is parsed once. Loading a GGUF teacher reads the file's
    metadata five times (the tokenizer, the weight check, the config twice, the weights), and
    gguf's reader takes seconds for each on a 49k-token vocabulary (SmolLM2: about 3 s). The reader
    is only read, so one is shared per file and state (size, modification time); it is dropped
    when the context ends."""
    import gguf

    original = gguf.GGUFReader
    readers: dict[tuple, object] = {}

    def shared(path, mode="r"):
        if mode != "r":
            return original(path, mode)
        stat = os.stat(path)
        key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = shared
    try:
        yield
    finally:
        gguf.GGUFReader = original
        readers.clear()


@contextmanager
def _quiet_transformers():
    """Without transformers' load report of the trial load (a refusal says what it lacks)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
