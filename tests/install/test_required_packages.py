"""What `make` requires of the machine: a configure with ATTNSCALE_REQUIRE_TORCH=ON or
ATTNSCALE_REQUIRE_MPI=ON (both set by the Makefile and the `release` preset) fails with one error
naming the option and the Debian package when the package cannot be found, rather than building
without the training experiment or the MPI pieces and leaving their tests out.
"""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("option, package, debian", [
    ("ATTNSCALE_REQUIRE_TORCH", "Torch", "libtorch-dev"),
    ("ATTNSCALE_REQUIRE_MPI", "MPI", "libopenmpi-dev"),
])
def test_a_required_package_that_is_missing_stops_the_configure(option, package, debian, tmp_path):
    r = subprocess.run(["cmake", "-S", ROOT, "-B", tmp_path / "build", "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                        f"-DPython3_EXECUTABLE={sys.executable}", f"-D{option}=ON",
                        f"-DCMAKE_DISABLE_FIND_PACKAGE_{package}=ON"], capture_output=True, text=True)
    assert r.returncode != 0
    errors = r.stderr.count("CMake Error")
    assert errors == 1, r.stderr
    message = " ".join(r.stderr.split())
    assert f"{option}=ON but" in message and debian in message and f"-D{option}=OFF" in message, message


def test_the_makefile_and_the_release_preset_require_both():
    makefile = (ROOT / "Makefile").read_text()
    presets = (ROOT / "CMakePresets.json").read_text()
    for option in ("ATTNSCALE_REQUIRE_TORCH", "ATTNSCALE_REQUIRE_MPI"):
        assert f"-D{option}=ON" in makefile
        assert f'"{option}": "ON"' in presets
