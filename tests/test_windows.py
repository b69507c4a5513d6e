"""Teacher windows: every row exactly once, with the promised left context."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from distill.teacher.windows import plan_windows


@given(m=st.integers(0, 300), prefix=st.integers(1, 3), max_length=st.integers(8, 40), data=st.data())
def test_windows_cover_rows_once_with_context(m, prefix, max_length, data):
    stride = data.draw(st.integers(0, max_length - prefix - 1))
    windows = plan_windows(m, prefix, max_length, stride)
    rows = [r for w in windows for r in range(w.row_start, w.row_stop)]
    assert rows == list(range(m + 1))
    for w in windows:
        assert w.input_length(prefix) <= max_length
        positions = w.output_positions(prefix)
        assert len(positions) == w.row_stop - w.row_start
        assert positions[0] >= prefix - 1 and positions[-1] < w.input_length(prefix)
        for r in range(w.row_start, w.row_stop):
            seen = r - w.token_start  # tokens t_{token_start}..t_{r-1} precede row r
            assert seen == r or seen >= stride


def test_short_document_is_one_window():
    (w,) = plan_windows(10, 1, 2048, 512)
    assert (w.token_start, w.token_stop, w.row_start, w.row_stop) == (0, 10, 0, 11)


def test_bad_stride():
    with pytest.raises(ValueError):
        plan_windows(10, 1, 16, 15)
