"""The compiled decode path (docs/DESIGN.md, "Decoding"): ``generate()`` options under which a
step costs what the model computes, not the Python around it.

Both architectures take the same options through stock ``generate``: ``cache_implementation="static"``
(caches allocated once for the generation, so every step has the same shapes) and a
``compile_config``. The flat student is a stock Llama, so ``transformers`` compiles its forward
with its ``StaticCache``; the patched student compiles its own step's three parts
(``PatchedStudent.compiled_steps``). On the CPU inductor writes C++ (``cpp_wrapper``: the step's
kernels called from C++, not Python) with the system's compiler; on a GPU it captures CUDA graphs.
Without a C++ compiler, or when compiling fails, generation runs eagerly and gives the same symbols.
"""

from __future__ import annotations

import shutil
import sys

import torch
from transformers import CompileConfig

from common.errors import first_line

CXX_COMPILERS = ("c++", "g++", "clang++")


def compile_config(device: torch.device | str) -> CompileConfig:
    """What to compile the step with on ``device``: C++ kernels and wrapper on the CPU, CUDA graphs on a GPU."""
    if torch.device(device).type == "cpu":
        config = CompileConfig(fullgraph=True, mode=None, options={"cpp_wrapper": True})
        config._compile_all_devices = True  # transformers compiles on the GPU only unless told
        return config
    return CompileConfig(fullgraph=True)  # mode "reduce-overhead": CUDA graphs


def why_not_compiled(device: torch.device | str) -> str | None:
    """Why the step cannot be compiled on ``device`` (None: it can)."""
    if torch.device(device).type == "cpu" and not any(shutil.which(name) for name in CXX_COMPILERS):
        return f"no C++ compiler ({', '.join(CXX_COMPILERS)}) on PATH"
    return None


def compiled_decoding(model) -> dict:
    """``generate()`` keyword arguments of the compiled decode path for ``model`` (none, with a
    one-line warning, where it cannot compile: eager decoding)."""
    device = next(model.parameters()).device
    reason = why_not_compiled(device)
    if reason is not None:
        print(f"warning: decoding eagerly: {reason}", file=sys.stderr)
        return {}
    return {"cache_implementation": "static", "compile_config": compile_config(device)}


def generate_compiled(model, **kwargs):
    """``model.generate(**kwargs)`` on the compiled decode path, eagerly where compiling fails
    (one warning line): the same symbols either way."""
    decoding = compiled_decoding(model)
    if not decoding:
        return model.generate(**kwargs)
    random_state = torch.random.get_rng_state()
    cuda_state = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        return model.generate(**kwargs, **decoding)
    except torch._dynamo.exc.BackendCompilerFailed as error:  # e.g. the C++ compiler fails
        warn_compiling_failed(error)
        torch.random.set_rng_state(random_state)  # sampling draws what it would have drawn
        if cuda_state is not None:
            torch.cuda.set_rng_state_all(cuda_state)
        return model.generate(**kwargs)


def warn_compiling_failed(error: torch._dynamo.exc.BackendCompilerFailed) -> None:
    """The one warning line of a step that decodes eagerly from now on: the compiler's own error."""
    inner = error.inner_exception or error
    print(
        f"warning: decoding eagerly: compiling the step failed ({type(inner).__name__}: {first_line(inner)})",
        file=sys.stderr,
    )
