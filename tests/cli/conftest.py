"""Shared fixtures for end-to-end tests of the attnscale command-line tool."""
import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def attnscale_bin():
    path = os.environ.get("ATTNSCALE_BIN", str(ROOT / "build" / "bin" / "attnscale"))
    if not os.path.exists(path):
        pytest.fail(f"attnscale binary not found at {path}; run `make build` first")
    return path


@pytest.fixture
def run(attnscale_bin):
    """Runs the CLI; returns CompletedProcess with text stdout/stderr."""

    def _run(*args, check=False):
        return subprocess.run([attnscale_bin, *map(str, args)], capture_output=True, text=True,
                              check=check, timeout=120)

    return _run
