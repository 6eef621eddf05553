"""libtorch loads only for a training run, from the lab's libtorch module
(src/lab/experiments/training/torch_module.h), and a missing module, or one of another build, is one
clear error.

Which shared objects a command opened is read from the dynamic loader's own log (LD_DEBUG=files):
the libraries it needs at start and the ones opened later with dlopen.
"""
import os
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

MODULE = "libattnscale_torch_units.so"
TINY_TRAINING = ["experiment", "training", "--grid", "quick", "--scaling", "sqrt", "--lr", "0.01", "--seeds", "1",
                 "--steps", "1", "--seq-len", "8", "--batch", "2", "--d-model", "8", "--d-head", "4",
                 "--torch-check", "", "--threads", "1"]


@pytest.fixture(scope="module")
def with_training(attnscale_bin):
    listing = subprocess.run([attnscale_bin, "experiment", "--help"], capture_output=True, text=True, check=True)
    if "training" not in listing.stdout:
        pytest.skip("built without libtorch: no training experiment")


def opened_libraries(binary, args, log_dir, returncode=0):
    """The file names of the shared objects the dynamic loader opened while `binary args` ran."""
    log_dir.mkdir()
    env = dict(os.environ, LD_DEBUG="files", LD_DEBUG_OUTPUT=str(log_dir / "ld"))
    r = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == returncode, r.stderr
    names = set()
    for log in log_dir.glob("ld.*"):  # one per process id
        for line in log.read_text().splitlines():
            # "  4218:	file=libtorch_cpu.so.1.13 [0];  needed by ..." (or "dynamically loaded by ...")
            if "file=" in line:
                names.add(pathlib.Path(line.split("file=", 1)[1].split()[0]).name)
    assert names, "no loader log: LD_DEBUG ignored?"
    return names


def attend_inputs(tmp_path):
    rng = np.random.default_rng(0)
    for name in "qkv":
        np.save(tmp_path / f"{name}.npy", rng.standard_normal((2, 5, 8)).astype(np.float32))
    return ["--q", tmp_path / "q.npy", "--k", tmp_path / "k.npy", "--v", tmp_path / "v.npy", "--out", tmp_path / "o.npy"]


def torch_or_blas(names):
    return sorted(n for n in names if n.startswith(("libtorch", "libc10", "libopenblas", "libblas")))


def test_a_training_run_opens_the_module_and_libtorch(attnscale_bin, with_training, tmp_path):
    names = opened_libraries(attnscale_bin, TINY_TRAINING, tmp_path / "log")
    assert MODULE in names and any(n.startswith("libtorch_cpu") for n in names), sorted(names)


@pytest.mark.parametrize("command", ["version", "attend", "saturation", "listing", "bench-help", "report-help"])
def test_other_commands_load_neither_libtorch_nor_openblas(attnscale_bin, tmp_path, command):
    args = {"version": ["--version"],
            "attend": ["attend", *attend_inputs(tmp_path)],
            "saturation": ["experiment", "saturation", "--n", "4", "--d", "2", "--trials", "4"],
            "listing": ["experiment", "--help"],
            "bench-help": ["bench", "--help"],  # help runs nothing: no OpenBLAS opened for its kernels
            "report-help": ["report", "-h"]}[command]
    names = opened_libraries(attnscale_bin, args, tmp_path / "log")
    assert MODULE not in names and not torch_or_blas(names), torch_or_blas(names)


def test_training_flags_are_checked_without_libtorch(attnscale_bin, with_training, tmp_path):
    names = opened_libraries(attnscale_bin, ["experiment", "training", "--lr", "-1"], tmp_path / "log", returncode=2)
    assert MODULE not in names and not [n for n in names if n.startswith(("libtorch", "libc10"))], sorted(names)


def cli_copy(attnscale_bin, tmp_path):
    """The CLI copied to tmp_path/bin, and where it looks for the module (not there): the build tree
    and an installed copy have it in ../lib/attnscale/ (under every prefix: not the libraries' folder)."""
    bin_dir = pathlib.Path(attnscale_bin).resolve().parent
    real = next(bin_dir.parent.glob(f"lib*/**/attnscale/{MODULE}"), None)
    assert real is not None, f"no {MODULE} under {bin_dir.parent}/lib"
    copy = tmp_path / "bin" / "attnscale"
    copy.parent.mkdir()
    shutil.copy2(attnscale_bin, copy)
    return copy, copy.parent.parent / real.relative_to(bin_dir.parent)


def test_a_module_of_another_build_is_refused(attnscale_bin, with_training, tmp_path):
    stale = pathlib.Path(attnscale_bin).resolve().parent.parent / "tests" / "libattnscale_stale_torch_module.so"
    assert stale.exists(), f"{stale}: the build tree's stand-in module (tests/CMakeLists.txt) is missing"
    copy, module = cli_copy(attnscale_bin, tmp_path)
    module.parent.mkdir(parents=True)
    shutil.copy2(stale, module)
    version = subprocess.run([copy, "--version"], capture_output=True, text=True, check=True).stdout.split()
    r = subprocess.run([copy, *TINY_TRAINING], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr == (f"attnscale: error: the lab's libtorch module {module} is of attnscale 0.0.0 (000000000000), "
                        f"not of this {version[0]} {version[1]}: rebuild or reinstall attnscale\n")
    assert r.stdout == ""


def test_a_missing_module_is_one_clear_error(attnscale_bin, with_training, tmp_path):
    copy, missing = cli_copy(attnscale_bin, tmp_path)
    r = subprocess.run([copy, *TINY_TRAINING], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr == (f"attnscale: error: cannot load the lab's libtorch module {missing}: "
                        "cannot open shared object file: No such file or directory\n")
    assert r.stdout == ""
    # Without the module, the experiment is still listed and its flags are still checked.
    listing = subprocess.run([copy, "experiment", "--help"], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0 and "training" in listing.stdout and "recall" in listing.stdout
    bad = subprocess.run([copy, "experiment", "recall", "--seeds", "0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
    assert bad.stderr == "attnscale: error: --seeds: each value must be in [1, 1000], got 0\n"


def test_one_seed_is_told_as_too_few_runs(attnscale_bin, with_training):
    # Training has no trials: its rows over seeds lack an interval for want of runs, which the note
    # called "too few sweep points".
    r = subprocess.run([attnscale_bin, *TINY_TRAINING], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "have no confidence interval (too few runs (--seeds) behind it)" in r.stderr, r.stderr
