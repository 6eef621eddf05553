"""OpenBLAS's kernels for this CPU, for the Python benchmarks that time numpy or PyTorch beside us
(goals.py, compare.py, saturation_vs_numpy.py).

As `attnscale bench` does (cli/openblas_core.h): OpenBLAS picks its kernels by CPU model as it is
loaded, and Debian 12's takes its SSE3 ones ("Prescott") for a model it does not know (sgemm 2048^3
at 65 against 287 GFLOP/s on an Emerald Rapids guest; PyTorch's products are OpenBLAS's too, so its
attention ran 2.8x slower there). It reads OPENBLAS_CORETYPE only as it is loaded, so where that is
not set and the kernels are narrower than the CPU's vectors, `restart_with_openblas_core` sets it and
runs the script again.
"""
import ctypes
import os
import sys

AVX512_CORES = ("skylakex", "cooperlake", "sapphirerapids")  # OpenBLAS's kernels of each width
AVX2_CORES = ("haswell", "zen") + AVX512_CORES
CHOSE_VARIABLE = "ATTNSCALE_OPENBLAS_CHOSE"  # what OpenBLAS took before the restart


def openblas_core():
    """The kernels OpenBLAS runs (loading it if numpy or torch has not)."""
    name = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
    name.restype = ctypes.c_char_p
    return name().decode()


def restart_with_openblas_core():
    """Runs this script again with OPENBLAS_CORETYPE set where OpenBLAS chose narrower kernels than
    the CPU's vectors and the variable was not set; returns otherwise."""
    if "OPENBLAS_CORETYPE" in os.environ:
        return
    core = openblas_core()
    with open("/proc/cpuinfo") as f:
        flags = set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    wanted = None
    if {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags and core.lower() not in AVX512_CORES:
        wanted = "SkylakeX"
    elif {"avx2", "fma"} <= flags and core.lower() not in AVX2_CORES:
        wanted = "Haswell"
    if wanted:
        os.environ["OPENBLAS_CORETYPE"] = wanted
        os.environ[CHOSE_VARIABLE] = core
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable] + sys.argv)


def openblas_core_note():
    """"SkylakeX kernels (OpenBLAS took Prescott; OPENBLAS_CORETYPE set by this script)" or "Haswell kernels"."""
    chose = os.environ.get(CHOSE_VARIABLE)
    return f"{openblas_core()} kernels" + (f" (OpenBLAS took {chose}; OPENBLAS_CORETYPE set by this script)"
                                          if chose else "")
