"""``bytedistill check-teacher``: the command line over :func:`distill.check_teacher.check_teacher`."""

from __future__ import annotations

from common.errors import UserError
from distill import check_teacher as checks


def check_teacher(config: checks.CheckTeacherConfig) -> int:
    """Check that a teacher's tokenizer can be distilled exactly.

    Describe a teacher's vocabulary (family, specials, end of text, prefix handling) and check, on a
    built-in multilingual/code/special-text sample, the byte-exact round trip and the conversion
    against a brute force over the vocabulary. Exit status 2 if it fails.
    """
    check = checks.check_teacher(config)
    print("\n".join(check.lines()[:-1]))
    if not check.ok:
        raise UserError(check.verdict().removeprefix("verdict: "))
    print(check.verdict())
    return 0
