"""The run view's value of a series at a checkpoint's step (core/run_view.py ``_At``), sorted once and bisected,
answers as the plain reading of its rule: the value logged at the greatest step at or before it, the one logged
last where a resumed run logged that step more than once, in whatever order the history holds them."""

from __future__ import annotations

from typing import Optional

from hypothesis import given
from hypothesis import strategies as st

from ckpt_tui.core.run_view import _At


def reference(series: list[tuple[int, float]], step: int) -> Optional[float]:
    best: Optional[tuple[int, float]] = None
    for s, v in series:
        if s <= step and (best is None or s >= best[0]):
            best = (s, v)
    return best[1] if best is not None else None


@given(
    st.lists(st.tuples(st.integers(-5, 60), st.floats(allow_nan=False)), max_size=40),
    st.lists(st.integers(-10, 70), min_size=1, max_size=20),
)
def test_at_answers_as_the_rule_read_plainly(series, steps):
    at = _At(series)
    assert [at(s) for s in steps] == [reference(series, s) for s in steps]


def test_a_resumed_run_takes_the_value_logged_last_at_a_repeated_step():
    series = [(10, 1.0), (20, 2.0), (30, 3.0), (20, 2.5), (30, 3.5)]  # resumed from step 10, steps 20 and 30 again
    at = _At(series)
    assert (at(5), at(10), at(25), at(30), at(99)) == (None, 1.0, 2.5, 3.5, 3.5)
