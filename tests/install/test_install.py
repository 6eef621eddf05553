"""attnscale as another project sees it once installed.

`cmake --install` into a temporary prefix, then: README.md's C++ example (extracted as written)
built by a separate CMake project through find_package(attnscale) against the shared and the static
library, and by g++ through pkg-config; the installed CLI and Python package; each install component
alone, and a consumer of the shared library from the `development` component alone with neither MPI
nor Highway's CMake package to be found; the Debian package from cpack, unpacked and also installed
with dpkg -i (as root) and purged again; the wheel from `pip wheel .` installed in a venv. Also: a
project that adds attnscale with add_subdirectory() configures without the test, CLI and Python
dependencies, keeps its own settings and builds the library under -Werror. ATTNSCALE_BUILD names
the built build folder (`make test` sets it); the install, the package and the wheel reuse what it
built.
"""
import fcntl
import gzip
import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ["ATTNSCALE_BUILD"]).resolve()
CONSUMER = ROOT / "tests/install/consumer"
VERSION = re.search(r"project\(attnscale VERSION ([0-9.]+)", (ROOT / "CMakeLists.txt").read_text()).group(1)
PYTHON_DIR = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/dist-packages"
# The libraries' folder under the prefix (GNUInstallDirs' CMAKE_INSTALL_LIBDIR; on Debian the multiarch
# lib/<triplet>, cmake/multiarch_libdir.cmake): the shared and static libraries, the CMake package
# and the pkg-config files. The lab's libtorch module stays in lib/attnscale/, a program's folder.
LIBDIR = re.search(r"^CMAKE_INSTALL_LIBDIR:PATH=(.*)$", (BUILD / "CMakeCache.txt").read_text(), re.M).group(1)
EXAMPLE_OUTPUT = re.compile(r"largest \|out - float64 reference\| = \S+")
# A Python snippet that must run from the installed package, not from the source or build tree.
IMPORT_CHECK = (
    "import numpy as np, attnscale, sys; "
    "q = np.random.default_rng(0).standard_normal((2, 5, 8), dtype=np.float32); "
    "o = attnscale.attention(q, q, q, causal=True); assert o.shape == (2, 5, 8); "
    "print(attnscale.__file__)"
)
# The installed distribution's version and the module's own.
VERSION_CHECK = "import importlib.metadata as m, attnscale; print(m.version('attnscale'), attnscale.__version__)"
# attnscale.torch: a differentiable call on torch tensors.
TORCH_WRAPPER_CHECK = (
    "import torch, attnscale.torch; torch.manual_seed(0); q = torch.randn(1, 2, 5, 8, requires_grad=True); "
    "o = attnscale.torch.attention(q, q, q, causal=True); o.sum().backward(); "
    "assert o.shape == q.grad.shape == (1, 2, 5, 8)"
)
# Where libtorch was found: the lab's libtorch module, which the CLI finds at ../lib/attnscale/ and
# attnscale._lab next to itself (src/lab/experiments/training/torch_module.h). One training step
# through each shows that an installed copy finds it.
TORCH_MODULE = "libattnscale_torch_units.so"
WITH_TORCH = any(BUILD.glob(f"lib*/**/attnscale/{TORCH_MODULE}"))
TINY_TRAINING = ["experiment", "training", "--grid", "quick", "--scaling", "sqrt", "--lr", "0.01", "--seeds", "1",
                 "--steps", "1", "--seq-len", "8", "--batch", "2", "--d-model", "8", "--d-head", "4",
                 "--torch-check", ""]
TRAINING_CHECK = (
    "from attnscale import lab; rows = lab.training(grid='quick', scaling='sqrt', lr=0.01, seeds=1, steps=1, "
    "seq_len=8, batch=2, d_model=8, d_head=4, torch_check='', as_frame=False); assert len(rows) > 0"
)


def run(args, **kw):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def python_env(path):
    env = dict(os.environ, PYTHONPATH=str(path))
    return env


def check_cli_training(cli, cwd):
    """One training step through an installed CLI, where libtorch was found."""
    if WITH_TORCH:
        assert "train_loss" in run([cli, *TINY_TRAINING], cwd=cwd).stdout


def check_python_training(site, cwd):
    """One training step through an installed Python package, where libtorch was found."""
    if WITH_TORCH:
        run([sys.executable, "-c", TRAINING_CHECK], cwd=cwd, env=python_env(site))


def check_training(cli, site, cwd):
    check_cli_training(cli, cwd)
    check_python_training(site, cwd)


HELP_PAGES = [["attend"], ["explain"], ["bench"], ["report"], ["experiment"], ["experiment", "training"]]
NAMED_DOC = re.compile(r"([a-z_-]+\.md): docs/ in the source,\s+share/doc/attnscale/ installed")


def check_docs_installed(root, cli=None):
    """docs/*.md as share/doc/attnscale/*.md; each one the CLI's help names (as "lab.md: docs/ in
    the source, share/doc/attnscale/ installed") is there, so the help is true of an installed copy."""
    docs = root / "share/doc/attnscale"
    for source in (ROOT / "docs").glob("*.md"):
        assert (docs / source.name).read_bytes() == source.read_bytes(), source.name
    if cli is not None:
        named = set()
        for page in HELP_PAGES:
            named.update(NAMED_DOC.findall(run([cli, *page, "--help"]).stdout))
        assert {"lab.md", "distributed.md"} <= named, named
        for name in named:
            assert (docs / name).is_file(), name


def dangling_links(root):
    return [p for p in pathlib.Path(root).rglob("*") if p.is_symlink() and not p.exists()]


# Without MPI (built with it: attnscale::distributed and its header are installed).
WITH_MPI = (BUILD / "src/libattnscale_distributed.a").exists()


@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    p = tmp_path_factory.mktemp("prefix")
    run(["cmake", "--install", BUILD, "--prefix", p])
    return p


@pytest.fixture(scope="module")
def components(tmp_path_factory):
    """Each install component alone, in a prefix of its own: {component: prefix}."""
    root = tmp_path_factory.mktemp("components")
    for component in COMPONENTS:
        run(["cmake", "--install", BUILD, "--component", component, "--prefix", root / component])
    return {component: root / component for component in COMPONENTS}


COMPONENTS = ["runtime", "development", "cli", "python"]


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """README.md's first C++ block, written to example.cc exactly as the README shows it."""
    blocks = re.findall(r"```cpp\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "README.md has no ```cpp block"
    path = tmp_path_factory.mktemp("example") / "example.cc"
    path.write_text(blocks[0])
    return path


def check_torch_module_installed_once(root, python_dir):
    """The lab's libtorch module is one file, lib/attnscale/'s; the Python package's is a relative
    symbolic link to it (the tree can be moved, or unpacked elsewhere, as a whole)."""
    if not WITH_TORCH:
        return
    module, link = root / "lib/attnscale" / TORCH_MODULE, root / python_dir / "attnscale" / TORCH_MODULE
    assert module.is_file() and not module.is_symlink(), module
    assert link.is_symlink() and not os.path.isabs(os.readlink(link)), link
    assert link.resolve() == module.resolve(), (link, os.readlink(link))


def test_installed_tree_holds_every_part(prefix):
    for rel in ["include/attnscale/attention.h", f"{LIBDIR}/libattnscale.a", f"{LIBDIR}/libattnscale.so", "bin/attnscale",
                f"{LIBDIR}/cmake/attnscale/attnscaleConfig.cmake", f"{LIBDIR}/pkgconfig/attnscale.pc",
                f"{PYTHON_DIR}/attnscale/__init__.py"]:
        assert (prefix / rel).exists(), rel
    for rel in [f"{LIBDIR}/libattnscale_distributed.a", f"{LIBDIR}/pkgconfig/attnscale-distributed.pc"]:
        assert (prefix / rel).exists() == WITH_MPI, rel
    check_torch_module_installed_once(prefix, PYTHON_DIR)
    check_docs_installed(prefix, prefix / "bin/attnscale")


def test_each_component_installs_alone(components, tmp_path):
    # One component installed without the others is complete: no link into a file another
    # component holds (the Python package's link to the libtorch module), and each part runs.
    for component, root in components.items():
        assert not dangling_links(root), (component, dangling_links(root))
    runtime = sorted(p.name for p in components["runtime"].rglob("*") if not p.is_dir())
    assert runtime == ["changelog.gz", "libattnscale.so.0", f"libattnscale.so.{VERSION}"], runtime
    for rel in ["include/attnscale/attention.h", f"{LIBDIR}/libattnscale.a", f"{LIBDIR}/libattnscale.so",
                f"{LIBDIR}/libattnscale.so.{VERSION}", f"{LIBDIR}/cmake/attnscale/attnscaleConfig.cmake",
                f"{LIBDIR}/pkgconfig/attnscale.pc"]:
        assert (components["development"] / rel).exists(), rel
    cli = components["cli"] / "bin/attnscale"
    assert run([cli, "--version"]).stdout.startswith(VERSION)
    assert (components["cli"] / "share/man/man1/attnscale.1.gz").is_file()
    check_docs_installed(components["cli"], cli)
    check_docs_installed(components["python"])
    check_cli_training(cli, tmp_path)
    site = components["python"] / PYTHON_DIR
    run([sys.executable, "-c", IMPORT_CHECK], cwd=tmp_path, env=python_env(site))
    check_torch_module_installed_once(components["python"], PYTHON_DIR)
    check_python_training(site, tmp_path)


def test_manual_page_holds_the_tool_and_every_subcommand(prefix, tmp_path):
    # `man attnscale` as installed: rendered without warnings, with a section for each subcommand
    # and each experiment `attnscale experiment --help` lists, and flags in plain ASCII hyphens (so
    # that a flag copied from the page works).
    page = prefix / "share/man/man1/attnscale.1.gz"
    env = dict(os.environ, MANWIDTH="120", LC_ALL="C.UTF-8")
    rendered = run(["man", "--warnings", "-l", page], env=env)
    assert rendered.stderr == "", rendered.stderr
    text = rendered.stdout
    cli = prefix / "bin/attnscale"
    listed = run([cli, "experiment", "--help"]).stdout.split("Subcommands:\n", 1)[1]
    experiments = re.findall(r"^  ([a-z_]+) ", listed, re.M)
    assert "training" in experiments and "moments" in experiments, experiments
    for name in ["attend", "explain", "bench", "report", "experiment"] + [f"experiment {e}" for e in experiments]:
        assert re.search(rf"^\s+attnscale {name}$", text, re.M), f"no section for attnscale {name}"
    assert "--causal ALIGN" in text and "\u2010" not in text


def test_readme_example_through_find_package(prefix, example, tmp_path):
    distributed = [f"-DWITH_DISTRIBUTED={'ON' if WITH_MPI else 'OFF'}"]
    run(["cmake", "-S", CONSUMER, "-B", tmp_path, "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={prefix}",
         f"-DEXAMPLE={example}", "-DCMAKE_BUILD_TYPE=Release", *distributed])
    run(["cmake", "--build", tmp_path])
    for exe in ["example_shared", "example_static"]:
        assert EXAMPLE_OUTPUT.search(run([tmp_path / exe]).stdout)
    if WITH_MPI:
        assert "holds 5 of 10 rows" in run([tmp_path / "example_distributed"]).stdout
    # The shared build loads the installed libattnscale.so, not the build tree's.
    ldd = run(["ldd", tmp_path / "example_shared"]).stdout
    assert f"{prefix}/{LIBDIR}/libattnscale.so.0" in ldd, ldd


def test_find_package_in_a_clean_environment(components, example, tmp_path):
    # The shared library's user, from the development component alone, where neither MPI nor
    # Highway's CMake package can be found: the package looks for neither, enables no C compiler
    # and leaves the project's C++17 alone (the consumer builds with -Werror).
    common = ["cmake", "-S", CONSUMER, "-G", "Ninja", f"-DCMAKE_PREFIX_PATH={components['development']}",
              f"-DEXAMPLE={example}"]
    build = tmp_path / "shared"
    run([*common, "-B", build, "-DWITH_STATIC=OFF", "-DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON",
         "-DCMAKE_DISABLE_FIND_PACKAGE_hwy=ON"])
    run(["cmake", "--build", build])
    assert EXAMPLE_OUTPUT.search(run([build / "example_shared"]).stdout)
    assert "CMAKE_C_COMPILER:" not in (build / "CMakeCache.txt").read_text()
    commands = run(["ninja", "-C", build, "-t", "commands", "example_shared"]).stdout
    assert "c++20" not in commands, commands
    # Asking for a part whose dependency is missing fails, naming what to install.
    missing = {"static": (["-DCMAKE_DISABLE_FIND_PACKAGE_hwy=ON"], "libhwy-dev"),
               "distributed": (["-DWITH_STATIC=OFF", "-DWITH_DISTRIBUTED=ON", "-DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON"],
                               "libopenmpi-dev" if WITH_MPI else "built without MPI")}
    for component, (args, named) in missing.items():
        r = subprocess.run([str(a) for a in [*common, "-B", tmp_path / component, *args]], capture_output=True, text=True)
        assert r.returncode != 0 and named in " ".join(r.stderr.split()), (component, r.stderr)


def test_public_headers_need_only_cxx17(prefix, tmp_path):
    # The package asks its users for C++17 (cxx_std_17, the pkg-config file's note): every installed
    # header compiles alone as C++17 without a warning (distributed.h needs mpi.h: left out here).
    for header in sorted((prefix / "include/attnscale").glob("*.h")):
        if header.name == "distributed.h":
            continue
        source = tmp_path / f"{header.stem}.cc"
        source.write_text(f'#include "attnscale/{header.name}"\n')
        run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-fsyntax-only",
             f"-I{prefix}/include", source])


def test_each_header_declares_the_error_its_functions_throw(prefix, tmp_path):
    # docs/api.md: bad arguments throw attnscale::Error. A program that includes only the header
    # of the function it calls (attention.h, as README.md's example does) can catch it by name.
    for header in sorted((prefix / "include/attnscale").glob("*.h")):
        if header.name in ("distributed.h", "version.h"):  # needs mpi.h; throws nothing
            continue
        source = tmp_path / f"catch_{header.stem}.cc"
        source.write_text(f'#include "attnscale/{header.name}"\n'
                          "bool caught() { try { throw attnscale::Error(\"x\"); }\n"
                          "                catch (const attnscale::Error&) { return true; } }\n")
        run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", f"-I{prefix}/include", source])


def test_readme_example_through_pkg_config(prefix, example, tmp_path):
    # Only attnscale's own .pc on the search path: the flags need no other package's .pc (not
    # libhwy-dev's) and carry nothing of Highway's; --static adds what the archive links.
    env = dict(os.environ, PKG_CONFIG_LIBDIR=str(prefix / LIBDIR / "pkgconfig"))
    env.pop("PKG_CONFIG_PATH", None)
    flags = run(["pkg-config", "--cflags", "--libs", "attnscale"], env=env).stdout.split()
    assert [f[:2] for f in flags] == ["-I", "-L", "-l"] and flags[-1] == "-lattnscale", flags
    exe = tmp_path / "example"
    # As a demanding project builds it: the public headers and the example warn about nothing.
    run(["g++", "-std=c++20", "-O1", "-Wall", "-Wextra", "-Werror", example, *flags, "-o", exe])
    out = run([exe], env=dict(os.environ, LD_LIBRARY_PATH=str(prefix / LIBDIR))).stdout
    assert EXAMPLE_OUTPUT.search(out)
    static = run(["pkg-config", "--static", "--libs", "attnscale"], env=env).stdout.split()
    assert static[-2:] == ["-pthread", "-lhwy"], static
    static = ["-l:libattnscale.a" if f == "-lattnscale" else f for f in static]  # the archive, by name
    run(["g++", "-std=c++20", "-O1", example, *flags[:1], *static, "-o", exe])
    assert "libattnscale" not in run(["ldd", exe]).stdout
    assert EXAMPLE_OUTPUT.search(run([exe]).stdout)


def test_distributed_library_through_pkg_config(prefix, tmp_path):
    # attnscale-distributed.pc (where the distributed library is built): its flags and attnscale's,
    # and MPI's from Debian's mpi-c.pc (on pkg-config's default path), build consumer/distributed.cc.
    if not WITH_MPI:
        return
    env = dict(os.environ, PKG_CONFIG_PATH=str(prefix / LIBDIR / "pkgconfig"))
    flags = run(["pkg-config", "--cflags", "--libs", "attnscale-distributed"], env=env).stdout.split()
    libs = [f for f in flags if f.startswith("-l")]
    assert libs[:2] == ["-lattnscale_distributed", "-lattnscale"] and "-lmpi" in libs, flags
    exe = tmp_path / "distributed"
    run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", CONSUMER / "distributed.cc", *flags, "-o", exe])
    out = run([exe], env=dict(os.environ, LD_LIBRARY_PATH=str(prefix / LIBDIR))).stdout
    assert "holds 5 of 10 rows" in out, out


def test_installed_cli_and_python_package(prefix, tmp_path):
    assert "softmax" in run([prefix / "bin/attnscale", "explain"]).stdout.lower()
    where = run([sys.executable, "-c", IMPORT_CHECK], cwd=tmp_path, env=python_env(prefix / PYTHON_DIR)).stdout
    assert where.strip().startswith(str(prefix / PYTHON_DIR)), where
    check_training(prefix / "bin/attnscale", prefix / PYTHON_DIR, tmp_path)


def test_add_subdirectory_needs_only_the_library(tmp_path):
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / "CMakeLists.txt").write_text(f"""
cmake_minimum_required(VERSION 3.25)
project(parent LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
add_subdirectory({ROOT} attnscale)
add_executable(app app.cc)
target_link_libraries(app PRIVATE attnscale::attnscale)
get_directory_property(options COMPILE_OPTIONS)
set(mpi_global "")
if(TARGET MPI::MPI_C)
  get_target_property(mpi_global MPI::MPI_C IMPORTED_GLOBAL)
endif()
file(WRITE ${{CMAKE_BINARY_DIR}}/seen.txt
     "runtime=${{CMAKE_RUNTIME_OUTPUT_DIRECTORY}};library=${{CMAKE_LIBRARY_OUTPUT_DIRECTORY}};"
     "archive=${{CMAKE_ARCHIVE_OUTPUT_DIRECTORY}};options=${{options}};type=${{CMAKE_BUILD_TYPE}};"
     "mpi_global=${{mpi_global}}")
""")
    (parent / "app.cc").write_text('#include "attnscale/attention.h"\nint main() { return 0; }\n')
    build = tmp_path / "build"
    run(["cmake", "-S", parent, "-B", build, "-G", "Ninja", "-DCMAKE_CXX_FLAGS=-Wall -Wextra -Werror"])
    assert (build / "seen.txt").read_text() == "runtime=;library=;archive=;options=;type=;mpi_global="
    cache = (build / "CMakeCache.txt").read_text()
    for dependency in ["GTest_DIR", "GTEST_INCLUDE_DIR", "CLI11_DIR", "pybind11_DIR", "nlohmann_json_DIR",
                       "benchmark_DIR", "Torch_DIR", "TORCH_LIBRARY", "Python3_EXECUTABLE", "MPI_C_COMPILER",
                       "MPI_C_LIB_NAMES", "MPI_C_FOUND", "MPI_CXX_COMPILER", "CMAKE_C_COMPILER"]:
        assert dependency not in cache, f"add_subdirectory(attnscale) looked for {dependency}"
    assert "hwy_DIR" in cache
    targets = run(["cmake", "--build", build, "--target", "help"]).stdout
    for absent in ["attnscale_cli", "unit_tests", "lab_tests", "_attnscale", "attnscale_lab"]:
        assert f"{absent}:" not in targets, absent
    # The parent's -Wall -Wextra -Werror reach the library's sources: kernels.cc, which has unused
    # parameters, builds (the whole library would take minutes); app stays C++17.
    run(["cmake", "--build", build, "--target", "attnscale/src/CMakeFiles/attnscale_objects.dir/attention/kernels.cc.o",
         "CMakeFiles/app.dir/app.cc.o"])
    app = run(["ninja", "-C", build, "-t", "commands", "CMakeFiles/app.dir/app.cc.o"]).stdout
    assert "c++20" not in app, app


def check_debian_package_contents(deb, root):
    """What Debian asks of a package's files (lintian's checks of them): everything under /usr and
    nothing in /usr/local, owned by root, writable by root alone, shared objects not executable,
    ELF files stripped and without a run path of the build tree's; the changelog of a native
    package; libattnscale.so.0's shlibs entry and ldconfig trigger; the postinst and prerm."""
    for line in run(["dpkg-deb", "-c", deb]).stdout.splitlines():
        mode, owner, path = line.split()[0], line.split()[1], line.split()[5]
        assert path.startswith("./usr/") and not path.startswith("./usr/local"), line
        assert owner == "root/root", line
        if mode[0] != "l":
            assert "w" not in mode[4:], line
        if mode[0] == "-" and ".so" in path:
            assert "x" not in mode, line
    elves = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p.read_bytes()[:4] == b"\x7fELF"]
    assert elves
    for elf in elves:
        assert ".symtab" not in run(["readelf", "-S", "-W", elf]).stdout, f"{elf} is not stripped"
        dynamic = run(["readelf", "-d", "-W", elf]).stdout
        assert "RUNPATH" not in dynamic and "RPATH" not in dynamic, f"{elf} has a run path"
    changelog = root / "usr/share/doc/attnscale/changelog.gz"
    assert gzip.decompress(changelog.read_bytes()).decode().startswith(f"attnscale ({VERSION}) "), changelog
    assert run(["dpkg-deb", "-I", deb, "triggers"]).stdout.split() == ["activate-noawait", "ldconfig"]
    assert run(["dpkg-deb", "-I", deb, "shlibs"]).stdout.split() == ["libattnscale", "0", "attnscale", "(>=", f"{VERSION})"]
    assert "py3compile -p attnscale" in run(["dpkg-deb", "-I", deb, "postinst"]).stdout
    assert "__pycache__" in run(["dpkg-deb", "-I", deb, "prerm"]).stdout
    # No maintainer script calls ldconfig (lintian: the trigger does it once dpkg is done; CPack would
    # write a postrm calling it, cmake/package.cmake).
    for script in ["postinst", "prerm", "postrm"]:
        commands = [line for line in run(["dpkg-deb", "-I", deb, script]).stdout.splitlines()
                    if not line.lstrip().startswith("#")]
        assert not [line for line in commands if "ldconfig" in line], (script, commands)
    # Debian's multiarch folder (dpkg's name for this machine's) holds the libraries, the CMake
    # package and the pkg-config files, which name the system prefix itself.
    multiarch = "usr/lib/" + run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"]).stdout.strip()
    for rel in ["libattnscale.so.0", f"libattnscale.so.{VERSION}", "libattnscale.so", "libattnscale.a",
                "cmake/attnscale/attnscaleConfig.cmake", "cmake/attnscale/attnscaleTargets.cmake", "pkgconfig/attnscale.pc"]:
        assert os.path.lexists(root / multiarch / rel), f"{multiarch}/{rel}"
    assert not list((root / "usr/lib").glob("libattnscale*")), sorted((root / "usr/lib").iterdir())
    for pc in (root / multiarch / "pkgconfig").glob("*.pc"):
        assert re.search(r"^prefix=/usr$", pc.read_text(), re.M), pc


@pytest.fixture(scope="module")
def deb():
    """The Debian package, written by cpack once for the tests that unpack it and install it."""
    run(["cpack", "-G", "DEB"], cwd=BUILD)
    debs = sorted((BUILD / "packages").glob("attnscale_*.deb"))
    assert debs, "cpack wrote no .deb"
    return debs[-1]


def test_debian_package_installs_and_runs(deb, tmp_path):
    fields = run(["dpkg-deb", "-f", deb, "Package", "Depends"]).stdout
    depends = re.search(r"^Depends: (.*)$", fields, re.M).group(1)
    assert "libhwy" in depends and "python3-numpy" in depends, depends
    assert not re.search(r"-dev\b", depends), depends  # development files are suggested, not required
    # Every dependency is satisfied on this machine (dpkg's own check of a dependency list).
    control = tmp_path / "control"
    control.write_text("")
    run(["dpkg-checkbuilddeps", "-d", depends, control])
    # Unpacked (not installed: that needs root and changes the machine for every other process),
    # then run from where dpkg would have put it.
    root = tmp_path / "root"
    run(["dpkg-deb", "-x", deb, root])
    out = run([root / "usr/bin/attnscale", "explain"]).stdout
    assert "softmax" in out.lower(), out
    check_debian_package_contents(deb, root)
    assert (root / "usr/share/man/man1/attnscale.1.gz").is_file()
    check_docs_installed(root / "usr", root / "usr/bin/attnscale")
    site = root / "usr/lib/python3/dist-packages"
    check_torch_module_installed_once(root / "usr", "lib/python3/dist-packages")
    where = run([sys.executable, "-c", IMPORT_CHECK], cwd=tmp_path, env=python_env(site)).stdout
    assert where.strip().startswith(str(site)), where
    check_training(root / "usr/bin/attnscale", site, tmp_path)


def test_debian_package_dpkg_install_and_remove(deb, example, tmp_path, request):
    # The real thing: dpkg -i, the installed CLI, Python package and CMake package, then dpkg --purge,
    # leaving the machine as it was. It needs root and a machine without attnscale installed (CI's).
    if os.geteuid() != 0:
        pytest.fail("dpkg -i needs root (CI runs make test as root)")
    # /usr is shared by every process on the machine: a second run of this test (another build
    # folder's `make test-install`) waits here instead of installing over or removing this one's.
    lock = open("/var/lock/attnscale-dpkg-test.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    request.addfinalizer(lock.close)
    installed = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "attnscale"], capture_output=True, text=True)
    assert "install ok installed" not in installed.stdout, "attnscale is already installed here; dpkg -r it first"
    try:
        run(["dpkg", "-i", deb])
        assert list(pathlib.Path("/usr/lib/python3/dist-packages/attnscale/__pycache__").glob("__init__.*.pyc")), \
            "the postinst compiled no bytecode"
        out = run(["/usr/bin/attnscale", "explain"], cwd=tmp_path).stdout
        assert "softmax" in out.lower(), out
        # As a user runs it: Python writes its bytecode beside the modules (which purge must remove).
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
        where = run(["/usr/bin/python3", "-c", IMPORT_CHECK], cwd=tmp_path, env=env).stdout.strip()
        assert where.startswith("/usr/lib/python3/dist-packages/attnscale"), where
        check_training("/usr/bin/attnscale", "/usr/lib/python3/dist-packages", tmp_path)
        consumer = tmp_path / "consumer"
        run(["cmake", "-S", ROOT / "tests/install/consumer", "-B", consumer, "-G", "Ninja", f"-DEXAMPLE={example}",
             "-DCMAKE_BUILD_TYPE=Release", f"-DWITH_DISTRIBUTED={'ON' if WITH_MPI else 'OFF'}"])
        run(["cmake", "--build", consumer])
        assert EXAMPLE_OUTPUT.search(run([consumer / "example_shared"]).stdout)
        if WITH_MPI:
            assert "holds 5 of 10 rows" in run([consumer / "example_distributed"]).stdout
        # pkg-config from its default search path: the system's folders, so no -I or -L at all;
        # the program finds libattnscale.so.0 through ld.so's cache (the package's ldconfig trigger).
        env = {k: v for k, v in env.items() if k not in ("PKG_CONFIG_PATH", "PKG_CONFIG_LIBDIR", "LD_LIBRARY_PATH")}
        names = ["attnscale", "attnscale-distributed"] if WITH_MPI else ["attnscale"]
        for name in names:
            assert run(["pkg-config", "--modversion", name], env=env).stdout.strip() == VERSION, name
        flags = run(["pkg-config", "--cflags", "--libs", "attnscale"], env=env).stdout.split()
        assert flags == ["-lattnscale"], flags
        run(["g++", "-std=c++20", example, *flags, "-o", tmp_path / "example"])
        triplet = run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"]).stdout.strip()
        ldd = run(["ldd", tmp_path / "example"], env=env).stdout  # /lib is /usr/lib on a merged-/usr system
        assert re.search(rf"libattnscale\.so\.0 => (/usr)?/lib/{triplet}/libattnscale\.so\.0 ", ldd), ldd
        assert EXAMPLE_OUTPUT.search(run([tmp_path / "example"], env=env).stdout)
    finally:
        # --purge, not -r: dpkg keeps no record of the package ("config-files") afterwards.
        subprocess.run(["dpkg", "--purge", "attnscale"], capture_output=True)
    # Nothing left behind, not even the folder of the Python package, which running it as root
    # filled with bytecode (removed by the package's prerm).
    multiarch = "/usr/lib/" + run(["dpkg-architecture", "-qDEB_HOST_MULTIARCH"]).stdout.strip()
    for left in ["/usr/bin/attnscale", "/usr/include/attnscale", "/usr/lib/attnscale", f"{multiarch}/cmake/attnscale",
                 f"{multiarch}/libattnscale.so.0", f"{multiarch}/pkgconfig/attnscale.pc", "/usr/lib/python3/dist-packages/attnscale",
                 "/usr/share/doc/attnscale", "/usr/share/man/man1/attnscale.1.gz"]:
        assert not os.path.lexists(left), f"dpkg --purge left {left}"
    gone = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "attnscale"], capture_output=True, text=True)
    assert gone.returncode != 0, f"dpkg still knows attnscale: {gone.stdout}"


def test_wheel_installs_into_a_venv(tmp_path):
    # As a project without an index gets it: `pip wheel` of the source tree, then that wheel
    # installed with --no-index into a venv; its metadata, the kernels, the torch wrapper and a
    # training run (the libtorch module inside the wheel).
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", venv])
    py = venv / "bin/python"
    env = dict(os.environ, ATTNSCALE_CMAKE_BUILD_DIR=str(BUILD), PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    dist = tmp_path / "dist"
    run([py, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", dist, ROOT],
        env=env, cwd=tmp_path)
    wheels = sorted(dist.glob(f"attnscale-{VERSION}-*.whl"))
    assert len(wheels) == 1, sorted(dist.iterdir())
    # The reused build folder was brought up to date whole: its CLI still opens its libtorch module.
    check_cli_training(BUILD / "bin/attnscale", tmp_path)
    env.pop("ATTNSCALE_CMAKE_BUILD_DIR")
    run([py, "-m", "pip", "install", "--no-index", "-q", wheels[0]], env=env, cwd=tmp_path)
    where = run([py, "-c", IMPORT_CHECK], cwd=tmp_path, env=env).stdout.strip()
    purelib = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env=env).stdout.strip()
    assert where.startswith(purelib), (where, purelib)
    versions = run([py, "-c", VERSION_CHECK], cwd=tmp_path, env=env).stdout.split()
    assert versions == [VERSION, VERSION], versions
    if importlib.util.find_spec("torch"):
        run([py, "-c", TORCH_WRAPPER_CHECK], cwd=tmp_path, env=env)
    if WITH_TORCH:
        run([py, "-c", TRAINING_CHECK], cwd=tmp_path, env=env)
