"""The order of the columns of a row of teacher logits.

The conversion reads a row's regular ids in byte-string order, then its end-of-text ids, then the
dropped specials (:class:`distill.convert.Converter`). A row in the teacher's own id order is read
through that permutation (a gather); a teacher whose output layer is permuted into it
(:meth:`distill.teacher.Teacher.with_sorted_head`) emits rows the conversion reads contiguously.
Logits carry their order (:class:`distill.teacher.TeacherLogits`), so the conversion is told it,
never guesses it.
"""

from __future__ import annotations

from enum import Enum


class ColumnOrder(Enum):
    TEACHER = "teacher"  # column i is teacher id i
    SORTED = "sorted"  # column i is teacher id Converter.sorted_columns[i]
