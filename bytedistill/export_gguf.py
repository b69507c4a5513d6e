"""``bytedistill export-gguf``: the command line over :func:`students.release.gguf_export.export_gguf`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from students.release.gguf_export import GGUF_TYPES


@dataclass
class ExportGgufConfig:
    folder: str = field(
        metadata={
            "help": "exported bytes-student folder (config.json, model.safetensors, tokenizer)",
            "positional": True,
        }
    )
    output: str = field(metadata={"help": "GGUF file to write (replaced only once it is whole)", "positional": True})
    type: str = field(
        default="f32",
        metadata={
            "help": "weight type: f32 (exact), f16, or q8_0 (8-bit blocks; a matrix whose rows do not split "
            "into blocks stays f16); norms are always f32",
            "choices": list(GGUF_TYPES),
        },
    )


def export_gguf(config: ExportGgufConfig) -> int:
    """Write a bytes student's exported folder as a GGUF file that stock llama.cpp runs.

    The weights become a GGUF of architecture llama; the tokenizer metadata makes llama.cpp's own
    tokenizer read text byte b as token b, with the specials as control tokens, the chat template
    and the end-of-turn symbol of a chat student."""
    from students.release.gguf_export import export_gguf as write

    out = write(Path(config.folder), Path(config.output), config.type)
    print(f"wrote {out} ({config.type}, {out.stat().st_size} bytes)")
    return 0
