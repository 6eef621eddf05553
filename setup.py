"""Builds the Python module attnscale into a wheel with CMake (pyproject.toml holds the metadata).

The extensions attnscale._attnscale, attnscale._lab and attnscale._distributed are CMake's targets
of those names: setuptools' build_ext step configures the project with only the library, the lab
and the module (no CLI, tests or benchmarks; see CMakeLists.txt), builds each target and copies it
into the wheel next to the package's .py files (python/attnscale/), _lab with the lab's libtorch
module beside it (libattnscale_torch_units.so, built with _lab where libtorch is found). The version
is the one in CMakeLists.txt's project().

ATTNSCALE_CMAKE_BUILD_DIR=<folder> builds in that folder instead of build/wheel; a folder already
configured (e.g. build/ from `make build`) is reused as it is, so nothing is compiled twice, and is
brought up to date whole.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(attnscale VERSION ([0-9.]+)", text).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = pathlib.Path(os.environ.get("ATTNSCALE_CMAKE_BUILD_DIR") or ROOT / "build" / "wheel")
        if not (build / "CMakeCache.txt").exists():
            args = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
                    f"-DPython3_EXECUTABLE={sys.executable}", "-DATTNSCALE_BUILD_PYTHON=ON",
                    "-DATTNSCALE_BUILD_LAB=ON", "-DATTNSCALE_BUILD_CLI=OFF", "-DATTNSCALE_BUILD_TESTS=OFF",
                    "-DATTNSCALE_BUILD_BENCH=OFF", "-DATTNSCALE_BUILD_SHARED=OFF", "-DATTNSCALE_INSTALL=OFF"]
            if shutil.which("ninja"):
                args += ["-G", "Ninja"]
            if shutil.which("ccache"):
                args += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
            subprocess.run(args, check=True)
        jobs = os.environ.get("JOBS") or str(os.cpu_count() or 1)
        name = ext.name.rsplit(".", 1)[-1]  # _attnscale, _lab or _distributed: CMake targets of that name
        # A folder of the caller's is built whole, not only this target: its programs and the lab's
        # libtorch module record the commit they were built from and must agree (torch_module.h), so
        # a partial build after a commit would leave its CLI unable to open the module.
        targets = [] if os.environ.get("ATTNSCALE_CMAKE_BUILD_DIR") else ["--target", name]
        subprocess.run(["cmake", "--build", str(build), *targets, "-j", jobs], check=True)
        built = sorted((build / "python" / "attnscale").glob(f"{name}.*.so"))
        if not built:
            raise RuntimeError(f"CMake built no {name}*.so in {build}/python/attnscale")
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built[-1], target)
        if name == "_lab":  # _lab opens the module next to itself (torch_module.h)
            for module in (build / "python" / "attnscale").glob("libattnscale_torch_units.so"):
                shutil.copy2(module, target.parent / module.name)


setup(
    version=project_version(),
    packages=["attnscale"],
    package_dir={"attnscale": "python/attnscale"},
    ext_modules=[Extension(f"attnscale.{name}", sources=[]) for name in ("_attnscale", "_lab", "_distributed")],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": "build/setuptools"}},
    zip_safe=False,
)
