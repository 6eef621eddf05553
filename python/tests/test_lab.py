"""attnscale.lab gives the numbers `attnscale experiment NAME --format csv` writes, bit for bit."""
import csv
import ctypes
import io
import json
import math
import os
import subprocess
import sys
import types

import pytest

from attnscale import lab

NAMES = [e["name"] for e in lab.experiments()]


def openblas_core():
    """The kernels of the OpenBLAS this process has loaded (numpy's, libtorch's)."""
    name = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
    name.restype = ctypes.c_char_p
    return name().decode()


def cli_csv(cli, name, seed, trials, threads, **flags):
    args = [cli, "experiment", name, "--format", "csv", "--seed", str(seed), "--threads", str(threads)]
    if trials is not None:
        args += ["--trials", str(trials)]
    for key, value in flags.items():
        args += ["--" + key, value]
    # The CLI on the OpenBLAS kernels this process runs (libtorch's products in the training runs
    # are OpenBLAS's, and the CLI would otherwise pick its own: cli/openblas_core.h).
    env = dict(os.environ, OPENBLAS_CORETYPE=openblas_core())
    done = subprocess.run(args, capture_output=True, text=True, check=True, env=env)
    return done.stdout


def assert_same_numbers(rows, text):
    table = list(csv.DictReader(io.StringIO(text)))
    assert len(table) == len(rows) > 0
    for row, want in zip(rows, table):
        for p in rows.param_names:
            assert str(row[p]) == want[p] or row[p] == lab._param_value(want[p])
        assert row["metric"] == want["metric"]
        for col in ("mean", "ci_low", "ci_high"):
            w = float(want[col])
            assert row[col] == w or (math.isnan(row[col]) and math.isnan(w)), (col, row, want)
        assert (row["theory"] is None) == (want["theory"] == "")
        if row["theory"] is not None:
            w = float(want["theory"])
            assert row["theory"] == w or (math.isnan(w) and math.isnan(row["theory"]))


def test_every_experiment_is_a_function():
    assert {"saturation", "variance"} <= set(NAMES)
    for e in lab.experiments():
        fn = getattr(lab, e["name"].replace("-", "_"))
        assert e["summary"] in fn.__doc__
        for flag, default, _ in e["flags"]:
            assert f"{flag.replace('-', '_')} = {default!r}" in fn.__doc__


# Experiments whose default sweep takes minutes (training runs) are checked on a tiny one.
SMALL = {"training": {"grid": "quick", "scaling": "sqrt", "lr": "0.01", "seeds": "1", "steps": "3",
                      "seq-len": "8", "batch": "2", "d-model": "8", "d-head": "4"},
         "recall": {"grid": "quick", "seeds": "1", "steps": "3", "batch": "2"}}


@pytest.mark.parametrize("name", NAMES)
def test_defaults_match_the_cli(cli, name):
    # Default flags, few trials; Python on one thread, the command line on two.
    trains = any(flag == "grid" for e in lab.experiments() if e["name"] == name for flag, _, _ in e["flags"])
    assert not trains or name in SMALL, f"{name} trains models: give it a tiny sweep in SMALL"
    flags = SMALL.get(name, {})
    trials = None if trains else 3  # a training run has no trials (--seeds sets its runs)
    rows = lab.run(name, seed=7, trials=trials, threads=1, as_frame=False,
                   **{k.replace("-", "_"): v for k, v in flags.items()})
    text = cli_csv(cli, name, 7, trials, 2, **flags)
    assert rows.csv == text
    assert_same_numbers(rows, text)
    assert rows.metadata["seed"] == 7 and rows.metadata["experiment"] == name
    assert rows.metadata["trials"] == (1 if trains else 3)


def test_saturation_sweep_matches_the_cli(cli):
    rows = lab.saturation(n=[50, 17], d=[1, 2, 64], scaling=("sqrt", "none"), trials=40, seed=3, as_frame=False)
    text = cli_csv(cli, "saturation", 3, 40, 0, n="50,17", d="1,2,64", scaling="sqrt,none")
    assert_same_numbers(rows, text)
    assert rows.csv == text
    assert rows.param_names == ["n", "d", "scaling"]
    assert {(r["n"], r["d"], r["scaling"]) for r in rows} == {
        (n, d, s) for n in (50, 17) for d in (1, 2, 64) for s in ("sqrt", "none")}


def test_variance_with_float_flags_matches_the_cli(cli):
    rows = lab.variance(d=range(1, 5), mu=0.25, sigma=1.5, dist=["normal", "uniform"], trials=30, seed=11,
                        as_frame=False)
    text = cli_csv(cli, "variance", 11, 30, 1, d="1,2,3,4", mu="0.25", sigma="1.5", dist="normal,uniform")
    assert_same_numbers(rows, text)


def test_seed_changes_the_numbers_and_threads_do_not():
    a = lab.variance(d=[2, 8], trials=20, seed=1, threads=1, as_frame=False)
    b = lab.variance(d=[2, 8], trials=20, seed=1, threads=3, as_frame=False)
    c = lab.variance(d=[2, 8], trials=20, seed=2, threads=1, as_frame=False)
    assert a.csv == b.csv  # texts: two d points give a slope without an interval (nan != nan)
    assert [r["mean"] for r in a] != [r["mean"] for r in c]


def test_progress_is_reported_in_order():
    calls = []
    lab.saturation(n=20, d=[1, 2, 3, 4], scaling="sqrt", trials=5, progress=lambda d, t: calls.append((d, t)),
                   as_frame=False)
    assert calls == [(i, 4) for i in range(1, 5)]


def test_an_error_in_progress_stops_the_run():
    def fail(done, total):
        raise KeyError("stop here")

    with pytest.raises(KeyError, match="stop here"):
        lab.saturation(n=20, d=[1, 2], trials=5, progress=fail, as_frame=False)


def test_errors_carry_the_cli_message():
    with pytest.raises(TypeError, match=r"^saturation\(\) got an unexpected keyword argument 'bogus'$"):
        lab.saturation(bogus=1)
    with pytest.raises(TypeError, match=r"^projections\(\) got an unexpected keyword argument 'x_maen' \(did you mean 'x_mean'\?\)$"):
        lab.projections(x_maen=0.5)
    with pytest.raises(ValueError, match=r"^--bogus: not a flag of experiment nope|^unknown experiment 'nope'"):
        lab.run("nope", bogus=1)
    with pytest.raises(ValueError, match=r"^d: expected a comma-separated list of integers, got '1,x'$"):
        lab.saturation(d="1,x")
    with pytest.raises(ValueError, match=r"^unknown experiment 'nope' \(known: "):
        lab.run("nope")
    with pytest.raises(ValueError, match=r"^seed: must be an integer from 0 to 2\*\*64 - 1, got -1$"):
        lab.saturation(seed=-1)
    with pytest.raises(ValueError, match=r"^trials: must be an integer from 1 to 2\*\*31, got 0$"):
        lab.saturation(trials=0)
    with pytest.raises(TypeError, match=r"^d: expected a string, a number or a list of them, got object$"):
        lab.saturation(d=object())


def test_messages_name_flags_as_keywords():
    # Before, lab.projections(x_mean=...) errors said --x-mean, the command line's spelling.
    with pytest.raises(ValueError, match=r"^x_mean: "):
        lab.projections(x_mean=1e300, trials=3)


@pytest.mark.parametrize("keyword, value", [
    ("threads", -1), ("threads", 1.5), ("threads", True), ("threads", 2**40), ("threads", "2"),
    ("seed", 2**64), ("seed", 1.0), ("trials", 2**31 + 1), ("trials", 2.0)])
def test_counts_out_of_range_or_not_integers_are_refused_by_name(keyword, value):
    # Before, threads=-1 ran on every core, threads=1.5 on one, and threads=2**40 or seed=2**64
    # raised pybind11's "incompatible function arguments" with the whole signature.
    with pytest.raises(ValueError, match=rf"^{keyword}: must be an integer from \d+ to "):
        lab.variance(d=[1, 4], **{"trials": 3, keyword: value})


def test_trials_of_a_training_run_are_refused_by_name():
    with pytest.raises(ValueError, match=r"^trials: experiment training trains models, it has no trials; seeds "):
        lab.training(grid="quick", trials=4)


def test_a_listed_value_twice_is_refused():
    # A repeated d would repeat its rows and count one point twice in the log-log slope's fit.
    with pytest.raises(ValueError, match=r"^d: each value may be listed once, got 16 twice in '1,16,16'$"):
        lab.variance(d=[1, 16, 16], trials=3)
    with pytest.raises(ValueError, match=r"^mu: each value may be listed once, got 0.5 and 5e-1 in '0.5,5e-1'$"):
        lab.moments(mu="0.5,5e-1", trials=3)


def test_a_dataframe_when_pandas_is_importable(monkeypatch):
    # pandas is optional: a stand-in module records what the lab hands to DataFrame.
    class Frame:
        def __init__(self, data, columns):
            self.data, self.columns, self.attrs = data, columns, {}

    monkeypatch.setitem(sys.modules, "pandas", types.SimpleNamespace(DataFrame=Frame))
    frame = lab.variance(d=[2], trials=5)
    assert isinstance(frame, Frame)
    assert frame.columns == ["d", "scaling", "dist", "metric", "mean", "ci_low", "ci_high", "theory"]
    assert frame.data == list(lab.variance(d=[2], trials=5, as_frame=False))
    assert frame.attrs["metadata"]["experiment"] == "variance"
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas now fails
    assert isinstance(lab.variance(d=[2], trials=5), lab.Rows)
    with pytest.raises(ImportError, match="as_frame=True needs pandas"):
        lab.variance(d=[2], trials=5, as_frame=True)


def test_dashed_flags_take_underscores(cli):
    # projections has --x-mean and --x-std: Python spells them x_mean and x_std.
    rows = lab.projections(n=20, dx=8, d=[4, 16], init=["normal", "xavier"], x_mean=0.25, x_std=1.5,
                           trials=5, seed=4, as_frame=False)
    text = cli_csv(cli, "projections", 4, 5, 2, n="20", dx="8", d="4,16", init="normal,xavier",
                   **{"x-mean": "0.25", "x-std": "1.5"})
    assert_same_numbers(rows, text)
    assert rows.metadata["flags"]["x-mean"] == "0.25" and rows.metadata["flags"]["x-std"] == "1.5"


def test_wishart_sampler_metadata_names_the_points_drawn_directly(cli):
    # n = 8: d = 4 lies below N (drawn directly), d = 16 not (Wishart); the CLI's JSON and the
    # Python rows both say so, and the recorded value runs the same sweep again.
    args = dict(n=8, d=[4, 16], scaling=["none", "sqrt"], sampler="wishart", trials=3, seed=5)
    rows = lab.saturation(**args, as_frame=False)
    assert rows.metadata["flags"]["sampler"] == "wishart (direct where d < N)"
    out = subprocess.run([cli, "experiment", "saturation", "--n", "8", "--d", "4,16", "--scaling", "none,sqrt",
                          "--sampler", "wishart", "--trials", "3", "--seed", "5", "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["metadata"]["flags"]["sampler"] == "wishart (direct where d < N)"
    again = lab.saturation(**dict(args, sampler=rows.metadata["flags"]["sampler"]), as_frame=False)
    assert [dict(r) for r in again] == [dict(r) for r in rows]


def test_ctrl_c_stops_a_long_run():
    # The child prints once the run is under way; SIGINT must then end it with KeyboardInterrupt
    # long before the sweep (hundreds of points) is done. The child installs Python's own SIGINT
    # handler: a process started in the background by a non-interactive shell inherits SIGINT
    # ignored, and Python then leaves it ignored, so without this the test would depend on how
    # the suite was launched.
    import os
    import signal
    import time

    child = subprocess.Popen(
        [sys.executable, "-c", (
            "import signal, sys, time\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from attnscale import lab\n"
            "def show(done, total):\n"
            "    if done == 1: print('running', flush=True)\n"
            "try:\n"
            "    lab.saturation(n=60, d=list(range(1, 400)), trials=200, threads=1, progress=show, as_frame=False)\n"
            "    print('finished')\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted')\n")],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    try:
        assert child.stdout.readline().strip() == "running"
        start = time.monotonic()
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=30)
    finally:
        child.kill()
    assert out.strip() == "interrupted"
    assert time.monotonic() - start < 10


@pytest.mark.skipif("training" not in NAMES, reason="built without libtorch")
def test_libtorch_loads_with_the_first_training_run():
    # A fresh interpreter: the lab and its other experiments map no libtorch; the first training
    # run opens the lab's libtorch module next to _lab (torch_module.h), which brings it.
    code = (
        "import pathlib\n"
        "from attnscale import lab\n"
        "def mapped(name): return name in pathlib.Path('/proc/self/maps').read_text()\n"
        "lab.saturation(n=4, d=[2], trials=4, as_frame=False)\n"
        "assert not mapped('libtorch') and not mapped('libattnscale_torch_units'), 'libtorch before training'\n"
        "lab.training(grid='quick', scaling='sqrt', lr=0.01, seeds=1, steps=1, seq_len=8, batch=2, d_model=8,\n"
        "             d_head=4, torch_check='', as_frame=False)\n"
        "from attnscale import _lab\n"
        "beside = pathlib.Path(_lab.__file__).parent / 'libattnscale_torch_units.so'\n"
        "assert mapped('libtorch_cpu') and mapped(str(beside)), 'no module beside _lab'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120,
                   env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
