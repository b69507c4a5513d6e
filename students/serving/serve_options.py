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
            "help": "compile the decode step (torch.compile: C++ on the CPU, CUDA graphs on a GPU) before serving: "
            "a graph per batch width, greedy and sampled, and cache size up to --warm-up-entries (seconds each on "
            "a CPU; /health answers 503 'warming' meanwhile); eager, with a warning, where it cannot"
        },
    )
    warm_up_entries: int = field(
        default=1024,
        metadata={
            "help": "with --compile: compile before serving the graphs of rows up to this many cache entries "
            "(symbols; a patched student's patches); a longer row compiles its graph when it first needs it",
            "range": COUNT,
        },
    )
    device: str = field(default="cpu", metadata={"help": "where the model runs: cpu, cuda, cuda:1, ..."})
