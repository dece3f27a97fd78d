"""The stage tests here use the prepared-workspace fixture of the other stage tests."""

from tests.tasks.conftest import prepared_params  # noqa: F401
