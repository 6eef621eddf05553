"""Numeric flags whose values, or whose product, no machine could run: refused before anything runs.

Each flag has a range (its --help and the manual page say which), and a sweep or bench run whose
arrays and rows together would need more memory than the machine has (RAM + swap) is refused with
one line naming the flags that set the size: exit code 2, nothing on stdout, no output file and no
FILE.partial journal. Before, `experiment variance --trials 2147483648` was taken and the run died
out of memory, and `--threads 1048576` started a thread per chunk of work.
"""
import subprocess

import numpy as np
import pytest

TOO_MANY = "2147483647"  # 2^31 - 1 trials: 32 GiB for one result a trial, before its columns


def refused(r, tmp_path, *words):
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("attnscale: error: "), r.stderr
    for w in words:
        assert w in lines[0], (w, lines[0])
    assert r.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "output left behind"


@pytest.mark.parametrize("trials", ["2147483648", TOO_MANY])
def test_trials_past_memory_are_refused_naming_them(run, tmp_path, trials):
    # variance keeps one q·k a trial for each of its 13 default head dimensions (416 GiB at 2^31).
    r = run("experiment", "variance", "--trials", trials, "--out", tmp_path / "x.csv")
    refused(r, tmp_path, f"--trials {trials} --d 1,2,4,8,16,32,64,128,256,512,1024,2048,4096: the sweep needs about",
            "GiB, more than the", "of memory (RAM + swap) this machine has; fewer trials or smaller sizes need less")


@pytest.mark.parametrize("name, args, flags", [
    ("columns", ["--trials", TOO_MANY], "--trials 2147483647 --n 50 --d 64:"),
    ("gradients", ["--trials", TOO_MANY], "--trials 2147483647 --n 50 --d "),
    # N^2 rows a matrix, 4 matrices a trial: 4·10^9 rows at N = 1024 and 1000 trials (about 2 TiB)
    ("heatmap", ["--n", "1024", "--trials", "1000"], "--trials 1000 --n 1024 --d 64 --scaling none,sqrt --axis row,column:"),
    # K [2^20, 2^16] float64: 512 GiB a trial
    ("length", ["--n", "1048576", "--d", "65536", "--rule", "fixed", "--trials", "2"], "--trials 2 --n 1048576 --d 65536 --rule fixed:"),
    ("moments", ["--trials", TOO_MANY], "--trials 2147483647 --d 1,4,16,64 --dist "),
    ("projections", ["--trials", TOO_MANY], "--trials 2147483647 --n 50 --dx 64 --d 64:"),
    # Q and K of 16 trials drawn directly at N = 8192, d = 2^20: 1 TiB a thread
    ("saturation", ["--n", "8192", "--d", "1048576", "--sampler", "direct", "--trials", "16"], "--trials 16 --n 8192 --d 1048576 --scaling "),
    ("variance", ["--d", "16777216", "--trials", TOO_MANY], "--trials 2147483647 --d 16777216:"),
    # 64 blocks of width 4096 with 64 heads of 1024: 7.7e10 parameters, before the activations
    ("training", ["--task", "mqar", "--seq-len", "128", "--batch", "4096", "--d-model", "4096", "--layers", "64",
                  "--heads", "64", "--d-head", "1024", "--lr", "0.001", "--seeds", "1", "--steps", "10"],
     "--batch 4096 --seq-len 128 --d-model 4096 --layers 64 --heads 64 --d-head 1024 --steps 10 --log-every "),
    ("recall", ["--batch", "4096", "--d-model", "4096", "--layers", "64", "--heads", "64", "--d-head", "1024"],
     "--batch 4096 --seq-len "),
])
def test_every_experiment_refuses_a_sweep_past_memory(run, tmp_path, name, args, flags):
    r = run("experiment", name, *args, "--threads", "2", "--out", tmp_path / "x.csv")
    refused(r, tmp_path, flags, "the sweep needs about", "of memory (RAM + swap) this machine has")


def test_large_legitimate_sweeps_still_run(run, tmp_path):
    # N = 65536 keys (K of 32 MiB a trial) and a million trials of one result are well inside memory.
    r = run("experiment", "length", "--n", "65536", "--d", "64", "--rule", "fixed", "--queries", "4", "--trials", "2")
    assert r.returncode == 0, r.stderr
    r = run("experiment", "variance", "--d", "1", "--scaling", "none", "--trials", "1000000")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("command", [["attend", "--q", "q.npy", "--k", "q.npy", "--v", "q.npy", "--out", "o.npy"],
                                     ["experiment", "variance", "--d", "1"], ["bench", "--rows", "small-call"],
                                     ["report", "--out", "r"]])
def test_threads_past_4096_are_refused(attnscale_bin, tmp_path, command):
    # As ATTNSCALE_THREADS: 1048576 was taken, and a thread started for each chunk of work.
    np.save(tmp_path / "q.npy", np.ones((3, 4), np.float32))
    r = subprocess.run([attnscale_bin, *command, "--threads", "4097"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    (tmp_path / "q.npy").unlink()
    refused(r, tmp_path, "--threads: expected an integer from 0 to 4096, got '4097'")


def test_bench_sizes_past_their_range_or_memory_are_refused(run, tmp_path):
    r = run("bench", "--n", "262145")
    refused(r, tmp_path, "--n: expected an integer from 1 to 262144, got '262145'")
    # Each of the 8 heads' q, k, v and output at N = 2^18, d = 2^16: 512 GiB a tensor.
    r = run("bench", "--n", "262144", "--d", "65536", "--rows", "fwd")
    refused(r, tmp_path, "--n 262144 --d 65536: a run of the forward rows needs about", "of memory (RAM + swap)")
