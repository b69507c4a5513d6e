"""Which teacher a command loads, and how (:class:`TeacherSource`: the ``dump`` flags ``--teacher``,
``--tokenizer``, ``--gguf-file``, ``--end-of-text``, ``--device`` and ``--dtype``).

Importing it loads no torch: ``bytedistill dump --help`` builds its parser from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from distill.teacher.model import Teacher

DTYPES = ("float32", "bfloat16", "float16")  # the teacher dtypes a command may name (besides auto)


@dataclass
class TeacherSource:
    """The teacher's model and tokenizer, its end-of-text tokens, and where and in what dtype it runs."""

    source: str = field(metadata={"flag": "teacher", "help": "teacher: a model folder, a Hub id, or a .gguf file"})
    tokenizer: str | None = field(
        default=None, metadata={"help": "tokenizer source if not the teacher's own (folder, tokenizer.json, .gguf)"}
    )
    gguf_file: str | None = field(default=None, metadata={"help": "GGUF file name inside a teacher folder"})
    end_of_text: list[str] | None = field(
        default=None,
        metadata={
            "help": "end-of-text token(s) whose mass becomes <eos> (default: the usual names + the tokenizer's eos)"
        },
    )
    device: str = field(default="auto", metadata={"help": "cpu, cuda, cuda:N or auto (the accelerate device)"})
    dtype: str = field(
        default="auto",
        metadata={
            "help": "teacher dtype: auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16, float16",
            "choices": ["auto", *DTYPES],
        },
    )

    def load(self, device) -> Teacher:
        """The teacher loaded on ``device`` (a torch device: ``--device`` parsed)."""
        import torch

        from distill.teacher.model import load_teacher

        return load_teacher(
            self.source,
            tokenizer_source=self.tokenizer,
            gguf_file=self.gguf_file,
            device=device,
            dtype=None if self.dtype == "auto" else getattr(torch, self.dtype),
            end_of_text=self.end_of_text,
        )
