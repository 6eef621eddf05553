"""Open MPI's C interface is all attnscale uses of MPI: no binary it builds needs the library of
MPI's C++ bindings (libmpi_cxx), which linking CMake's MPI::MPI_CXX would add to each
(src/CMakeLists.txt links MPI::MPI_C). Read from each file's dynamic section (readelf -d).
"""
import pathlib
import subprocess

import pytest


def needed(path):
    """The shared libraries `path` names as NEEDED."""
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line]


def test_no_binary_needs_mpis_cxx_bindings(attnscale_bin):
    build = pathlib.Path(attnscale_bin).resolve().parents[1]
    if not (build / "bin" / "ring_attention_test").exists():  # tests/CMakeLists.txt builds it with MPI
        pytest.skip("built without MPI")
    files = {"the CLI": [pathlib.Path(attnscale_bin)],
             "libattnscale.so": sorted(build.glob("src/libattnscale.so")),
             "the Python modules": sorted(build.glob("python/attnscale/_*.so")),
             "the MPI tests": sorted(build.glob("bin/ring_attention_test"))}
    for what, paths in files.items():
        assert paths, f"{what}: not found under {build}"
        for path in paths:
            assert not [n for n in needed(path) if n.startswith("libmpi_cxx")], (path, needed(path))
    # Built with MPI, the CLI and the distributed module still need its C library.
    for path in files["the CLI"] + [p for p in files["the Python modules"] if p.name.startswith("_distributed")]:
        assert any(n.startswith("libmpi.so") for n in needed(path)), (path, needed(path))
