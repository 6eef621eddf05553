"""The rest of the module: self/multi-head attention, version, CPU target, GIL, docstrings."""
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import attnscale
import torch_reference


def test_self_attention_matches_projections(rng):
    x = rng.standard_normal((9, 6))
    wq, wk, wv = rng.standard_normal((6, 4)), rng.standard_normal((6, 4)), rng.standard_normal((6, 3))
    want, _, _ = torch_reference.attention(x @ wq, x @ wk, x @ wv, causal=True)
    got = attnscale.self_attention(x, wq, wk, wv, causal=True)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)


def test_multi_head_attention_concatenates_heads(rng):
    n, dx, h, dk, dv = 7, 10, 3, 4, 2
    x = rng.standard_normal((n, dx)).astype(np.float32)
    wq, wk = rng.standard_normal((dx, h * dk)), rng.standard_normal((dx, h * dk))
    wv, wo = rng.standard_normal((dx, h * dv)), rng.standard_normal((h * dv, 5))
    wq, wk, wv, wo = (w.astype(np.float32) for w in (wq, wk, wv, wo))
    heads = lambda m, d: m.reshape(n, h, d).transpose(1, 0, 2)  # [N, H*d] -> [H, N, d]
    out, _, _ = torch_reference.attention(heads(x @ wq, dk), heads(x @ wk, dk), heads(x @ wv, dv), scale="none")
    want = out.numpy().transpose(1, 0, 2).reshape(n, h * dv) @ wo
    got = attnscale.multi_head_attention(x, wq, wk, wv, wo, h, scale="none")
    assert got.dtype == np.float32 and got.shape == (n, 5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_version_and_target():
    assert attnscale.version() == attnscale.__version__
    assert attnscale.version().count(".") == 2
    assert isinstance(attnscale.git_hash(), str) and attnscale.git_hash()
    assert isinstance(attnscale.cpu_target(), str) and attnscale.cpu_target()


def test_gil_is_released_while_computing(rng):
    # A Python thread keeps running while this one is inside attention(): the counter takes a
    # timestamp only while it holds the GIL, so with the GIL held during the call no timestamp
    # could fall inside a call's [start, end].
    q = rng.standard_normal((1, 1, 1024, 64)).astype(np.float32)
    done = threading.Event()
    ticks, calls = [], []

    def count():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.0005)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        first = time.perf_counter()
        while time.perf_counter() - first < 0.3:
            start = time.perf_counter()
            attnscale.attention(q, q, q, threads=1)
            calls.append((start, time.perf_counter()))
    finally:
        done.set()
        counter.join()
    during = [t for t in ticks if any(a < t < b for a, b in calls)]
    assert len(during) >= 3, (len(during), len(calls))


def test_docstrings_have_examples():
    for fn in (attnscale.attention, attnscale.attention_backward, attnscale.self_attention,
               attnscale.multi_head_attention):
        assert "Example:" in fn.__doc__ and ">>> " in fn.__doc__
        assert fn.__doc__.startswith(fn.__name__ + "(")


def test_docstring_examples_run():
    import doctest

    import attnscale.torch

    for module in (attnscale, attnscale._attnscale, attnscale.torch):
        failures, tried = doctest.testmod(module, verbose=False)
        assert failures == 0 and tried > 0, module.__name__


def test_docstrings_name_docs_as_installed_too():
    """A docstring that names a document by its path in the source (docs/performance.md) points an
    installed copy's reader nowhere: docs are named as the CLI's help names them, "performance.md:
    docs/ in the source, share/doc/attnscale/ installed"."""
    import ast
    import pathlib
    import re

    source_path = re.compile(r"docs/[\w-]+\.md")
    docs = [(name, getattr(attnscale._attnscale, name).__doc__ or "") for name in dir(attnscale._attnscale)]
    for path in pathlib.Path(attnscale.__file__).resolve().parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                docs.append((f"{path.name}:{getattr(node, 'name', '')}", ast.get_docstring(node) or ""))
    assert len(docs) > 20
    named = [(where, m) for where, doc in docs for m in source_path.findall(doc)]
    assert named == [], named


def libraries_loaded_by(code, *names):
    """The files of the shared libraries whose path holds one of `names`, loaded once `code` has run
    in a fresh interpreter."""
    probe = (
        f"{code}\n"
        "maps = open('/proc/self/maps').read()\n"
        f"print(sorted({{l.split('/')[-1] for l in maps.splitlines() if any(n in l for n in {names!r})}}))\n"
    )
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()


def test_import_loads_neither_libtorch_nor_mpi():
    # The kernels' module links only the library; the lab (libtorch with its first training run) and
    # ring attention (Open MPI) are modules of their own, loaded when attnscale.lab /
    # attnscale.distributed are.
    code = "import attnscale, numpy as np\nattnscale.attention(np.ones((2, 4)), np.ones((3, 4)), np.ones((3, 4)))"
    assert libraries_loaded_by(code, "libtorch", "libmpi") == "[]"


def test_the_lab_loads_no_mpi():
    """docs/python.md said Open MPI comes with attnscale.lab; the lab's module links none (its sweeps
    run in one process), and only attnscale.distributed loads it."""
    code = "import attnscale.lab as lab\nlab.variance(d=[1, 4], trials=2, threads=1)"
    assert libraries_loaded_by(code, "libmpi") == "[]"


def test_float16_conversion_matches_numpy_bit_for_bit(rng):
    """_convert (the torch wrappers' float16 <-> float32): numpy's rounding (nearest even) for float32
    values of random bits (every exponent, subnormals, infinities), every float16 value back to float32,
    a strided source; a read-only or mistyped destination is refused."""
    bits = rng.integers(0, 2**32, size=100003, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[~np.isnan(x)]
    h = np.empty(x.shape, np.float16)
    attnscale._attnscale._convert(x, h)
    with np.errstate(over="ignore"):  # values past the largest half become infinity, as intended
        want = x.astype(np.float16)
    assert np.array_equal(h.view(np.uint16), want.view(np.uint16))
    every = np.arange(2**16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    every = every[~np.isnan(every)]
    f = np.empty(every.shape, np.float32)
    attnscale._attnscale._convert(every, f)
    assert np.array_equal(f.view(np.uint32), every.astype(np.float32).view(np.uint32))
    block = rng.standard_normal((6, 10)).astype(np.float32)
    out = np.empty((6, 5), np.float16)
    attnscale._attnscale._convert(block[:, ::2], out)
    assert np.array_equal(out, block[:, ::2].astype(np.float16))
    frozen = np.empty((6, 5), np.float16)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="dst: the array is read-only"):
        attnscale._attnscale._convert(block[:, ::2], frozen)
    with pytest.raises(ValueError, match="dst: shape"):
        attnscale._attnscale._convert(block, out)
