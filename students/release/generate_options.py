"""How ``generate`` samples (:class:`GenerateOptions`, the ``generate`` flags); generation itself is
:mod:`students.release.generate`.

Importing it loads no torch: ``bytedistill generate --help`` builds its parser from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from configs.ranges import COUNT, NON_NEGATIVE, POSITIVE, SEED, Range


@dataclass
class GenerateOptions:
    max_new_bytes: int = field(
        default=200,
        metadata={"help": "text bytes to generate (the token ends the student places not counted)", "range": COUNT},
    )
    temperature: float = field(default=1.0, metadata={"help": "sampling temperature", "range": POSITIVE})
    top_k: int = field(
        default=0, metadata={"help": "sample from the k most likely symbols (0: all)", "range": NON_NEGATIVE}
    )
    top_p: float = field(
        default=1.0, metadata={"help": "nucleus sampling mass", "range": Range(0.0, 1.0, low_open=True)}
    )
    greedy: bool = field(default=False, metadata={"help": "take the most likely symbol instead of sampling"})
    seed: int = field(default=0, metadata={"help": "random seed for sampling", "range": SEED})
    compile: bool = field(
        default=False,
        metadata={
            "help": "compile the decode step (static caches, torch.compile: C++ on the CPU, CUDA graphs on a GPU): "
            "the first steps wait for the compiler (again when the window slides past the context), later ones "
            'run faster (docs/RESULTS.md, "Generation"); eager, with a warning, where it cannot compile'
        },
    )
