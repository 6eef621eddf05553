"""Shared fixtures: the attnscale package from build/python and a seeded random generator."""
import hashlib
import os
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# `make test` sets PYTHONPATH=build/python; running pytest by hand finds the same build.
if not any(pathlib.Path(p, "attnscale", "__init__.py").exists() for p in sys.path if p):
    sys.path.insert(0, str(ROOT / "build" / "python"))


@pytest.fixture
def rng(request):
    """A generator seeded from the test's name: fresh data per test, the same on every run."""
    seed = int(hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12], 16)
    return np.random.default_rng(seed)


@pytest.fixture(scope="session")
def cli():
    """Path of the attnscale command-line tool."""
    path = os.environ.get("ATTNSCALE_BIN", str(ROOT / "build" / "bin" / "attnscale"))
    if not os.path.exists(path):
        pytest.fail(f"attnscale CLI not found at {path}; build it with `make build`")
    return path
