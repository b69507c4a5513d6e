"""``bytedistill serve``: the command line over :mod:`students.serving.server`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from common.devices import parse_device
from common.errors import UserError
from students.serving.serve_options import ServeOptions


@dataclass(kw_only=True)
class ServeConfig(ServeOptions):
    """The server's options (their flags) and the model."""

    model: str = field(metadata={"help": "exported model folder", "positional": True})


def serve(config: ServeConfig) -> int:
    """Serve an exported student over an OpenAI-compatible HTTP API (/v1/completions,
    /v1/chat/completions, /v1/models, /health), decoding requests together as they come.

    max_tokens and usage count bytes, not tokens: the student writes bytes."""
    if config.default_max_tokens > config.max_tokens_limit:
        raise UserError(
            f"--default-max-tokens {config.default_max_tokens} is more than --max-tokens-limit {config.max_tokens_limit}"
        )
    parse_device(config.device, "--device")  # refused before the model loads
    from students.serving.server import Server, listening_socket, load_served

    try:  # before the model loads: an address in use is refused at once
        listening_socket(config.host, config.port).close()
    except OSError as exc:
        raise UserError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    served = load_served(Path(config.model), config)
    try:
        server = Server(served, config.host, config.port)
    except OSError as exc:
        served.engine.close()
        raise UserError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from None
    print(
        f"serving {served.name} ({config.slots} slots, queue {config.max_queue}) on {server.url}/v1"
        f"{' (API key required)' if config.api_key else ''}"
        f"{'; compiling the decode step first (/health: 503 warming until ready)' if not served.engine.ready.is_set() else ''}",
        file=sys.stderr,
        flush=True,
    )
    server.run()
    return 0
