"""tests/unit builds its trees from data/ (checked in); it never touches the real-fixture cache."""

from __future__ import annotations

import pytest

from . import trees


@pytest.fixture
def tree(tmp_path):
    """tree(variant, name=None) -> Path of a fresh copy of a checked-in variant under tmp_path."""
    return lambda variant, name=None: trees.tree(variant, tmp_path, name)


_NO_REAL = (
    "tests/unit must not use the real-framework fixtures (they import torch and may take minutes to "
    "generate): build the tree from data/ with the `tree` fixture, or put the test in tests/functional/core/"
)


@pytest.fixture
def real_ckpt():
    pytest.fail(_NO_REAL)


@pytest.fixture
def real_ckpt_copy():
    pytest.fail(_NO_REAL)
