"""The GPU check's tests run it with the command's interpreter and with Python 3.8."""

import pytest

from .test_gpucheck_main import _python38


@pytest.fixture(params=["python3", "python3.8"])
def python(request):
    """The interpreter named in the command, and Python 3.8, the oldest the check supports."""
    if request.param == "python3":
        return None
    found = _python38()
    if found is None:
        pytest.skip("no Python 3.8 interpreter on this machine to run the check with")
    return found
