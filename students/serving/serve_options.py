"""How ``serve`` runs (:class:`ServeOptions`, the ``serve`` flags); the server itself is
:mod:`students.serving.server`, the engine :mod:`students.serving.engine`.

Importing it loads no torch: ``bytedistill serve --help`` builds its parser from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from configs.ranges import COUNT, Range

PORT = Range(0, 65535)


@dataclass
class ServeOptions:
    host: str = field(
        default="127.0.0.1",
        metadata={"help": "address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)"},
    )
    port: int = field(default=8000, metadata={"help": "TCP port (0: any free one, printed at start)", "range": PORT})
    api_key: str | None = field(
        default=None,
        metadata={"help": "require 'Authorization: Bearer KEY' on every /v1 request (default: none required)"},
    )
    model_name: str | None = field(
        default=None, metadata={"help": "the model id clients name (default: the folder's name)"}
    )
    slots: int = field(
        default=8,
        metadata={"help": "requests decoded together (the batch; each slot's caches allocated once)", "range": COUNT},
    )
    max_queue: int = field(
        default=64,
        metadata={"help": "requests that may wait for a slot; more are refused with 503", "range": COUNT},
    )
    max_prompt_bytes: int = field(
        default=65536,
        metadata={"help": "longest prompt in UTF-8 bytes; longer ones are refused with 400", "range": COUNT},
    )
    max_tokens_limit: int = field(
        default=8192,
        metadata={"help": "largest max_tokens a request may ask for (max_tokens counts bytes)", "range": COUNT},
    )
    default_max_tokens: int = field(
        default=256, metadata={"help": "max_tokens (bytes) of a request that gives none", "range": COUNT}
    )
    compile: bool = field(
        default=False,
        metadata={
            "help": "compile the decode step (torch.compile: C++ on the CPU, CUDA graphs on a GPU); each batch "
            "bucket compiles on first use (a minute or more on a CPU); eager, with a warning, where it cannot"
        },
    )
    device: str = field(default="cpu", metadata={"help": "where the model runs: cpu, cuda, cuda:1, ..."})
