"""Shared pytest setup for the tests."""
import pytest

# The week test modules assert through this helper module; rewrite its asserts as pytest does
# a test module's, so a failing contract shows the values compared, not a bare AssertionError.
pytest.register_assert_rewrite("exercise_contract")
