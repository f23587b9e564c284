"""Fixtures shared by the constraint layer's tests."""
import pytest

from tamis.constrain import native


@pytest.fixture(scope="module")
def core():
    """The compiled core (constrain/_native*.c). A missing or stale build is an ImportError
    here, so the tests that compare it with its Python reference fail instead of skipping."""
    return native.load_extension()
