"""Fixtures shared by several test files."""

import os

import pytest


@pytest.fixture
def gen():
    """A fresh torch random generator per test; its seed is printed (pytest shows it on
    failure), so inputs differ run to run yet a failure can be replayed."""
    torch = pytest.importorskip("torch")
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)
