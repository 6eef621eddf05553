#!/usr/bin/python3
"""Writes the committed seed corpus under fuzz/corpus/<target>/ (deterministic: same bytes every run).

Seeds are starting points for the fuzzer and, replayed by ctest, a fixed set of inputs:
  npy_fuzz       valid .npy files of every accepted dtype, rank and format version, and one of
                 each kind of bad file the reader must refuse;
  cli_args_fuzz  command lines (first byte: 0 = whole attnscale command line, 1 = attention flags,
                 2 = one experiment's flags, the second byte picking the experiment);
  attention_fuzz random byte strings of assorted lengths (every byte string decodes to a problem).
Usage: /usr/bin/python3 fuzz/make_seed_corpus.py
"""
import io
import os
import struct

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def put(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def npy(arr, version=None):
    b = io.BytesIO()
    if version is None:
        np.save(b, arr)
    else:
        np.lib.format.write_array(b, arr, version=version)
    return b.getvalue()


def raw(header, data, version=1):
    pre = 10 if version == 1 else 12
    h = header + " " * ((64 - (pre + len(header) + 1) % 64) % 64) + "\n"
    n = struct.pack("<H", len(h)) if version == 1 else struct.pack("<I", len(h))
    return b"\x93NUMPY" + bytes([version, 0]) + n + h.encode("latin1") + data


def seed_npy():
    rng = np.random.default_rng(6)
    put("npy_fuzz", "f32_2d", npy(rng.standard_normal((3, 4)).astype("<f4")))
    put("npy_fuzz", "f64_4d", npy(rng.standard_normal((1, 2, 3, 2)).astype("<f8")))
    put("npy_fuzz", "f32_1d", npy(np.arange(5, dtype="<f4")))
    put("npy_fuzz", "bool_2d", npy(rng.standard_normal((4, 4)) > 0))
    put("npy_fuzz", "u8_3d", npy(np.arange(12, dtype="u1").reshape(2, 2, 3)))
    put("npy_fuzz", "f32_v2", npy(np.ones((2, 2), "<f4"), version=(2, 0)))
    put("npy_fuzz", "f32_v3", npy(np.ones((2,), "<f4"), version=(3, 0)))
    put("npy_fuzz", "zero_size", npy(np.zeros((0, 4), "<f4")))
    put("npy_fuzz", "big_endian", npy(np.ones((2, 2), ">f4")))
    put("npy_fuzz", "fortran", npy(np.asfortranarray(np.ones((2, 3), "<f4"))))
    put("npy_fuzz", "int64", npy(np.ones((3,), "<i8")))
    put("npy_fuzz", "rank5", npy(np.ones((1, 1, 1, 1, 2), "<f4")))
    put("npy_fuzz", "scalar", npy(np.float32(1)))
    put("npy_fuzz", "truncated", npy(np.ones((4, 4), "<f4"))[:-5])
    put("npy_fuzz", "oversized", npy(np.ones((2,), "<f4")) + b"\0" * 8)
    put("npy_fuzz", "huge_shape", raw("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000, 1000000), }", b"\0" * 16))
    put("npy_fuzz", "bad_magic", b"PK\x03\x04" + b"\0" * 60)
    put("npy_fuzz", "empty", b"")
    put("npy_fuzz", "double_quotes", raw('{"descr": "<f8", "fortran_order": False, "shape": (2,)}', b"\0" * 16))
    put("npy_fuzz", "no_fortran", raw("{'descr': '<f4', 'shape': (2,), }", b"\0" * 8))
    put("npy_fuzz", "extra_key", raw("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': True, }", b"\0" * 8))
    put("npy_fuzz", "v2_header", raw("{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }", b"\0" * 24, 2))


def seed_cli():
    lines = {
        "attend_min": [0, "attend", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy"],
        "attend_all": [0, "attend", "--q", "q.npy", "--k", "k.npy", "--v", "v.npy", "--out", "o.npy", "--lse",
                       "l.npy", "--probs", "p.npy", "--causal", "bottom-right", "--window", "3,0", "--scale",
                       "linear", "--threads", "2", "--reference", "--mask", "m.npy"],
        "attend_missing": [0, "attend", "--q", "q.npy"],
        "attend_unknown": [0, "attend", "--bogus", "1"],
        "explain": [0, "explain", "--n", "3", "--d", "2", "--seed", "7", "--causal", "top-left"],
        "explain_bad_n": [0, "explain", "--n", "-1", "--d", "x"],
        "help": [0, "--help"],
        "version": [0, "--version"],
        "no_sub": [0],
        "flags_default": [1],
        "flags_scale": [1, "--scale", "0.125"],
        "flags_scale_bad": [1, "--scale", "nan"],
        "flags_causal": [1, "--causal", "bottom-right", "--align", "top-left"],
        "flags_window": [1, "--window", "2,1", "--align", "bottom-right"],
        "flags_window_bad": [1, "--window", "-3,x"],
        "flags_window_unbounded": [1, "--window", "-1,-1", "--threads", "3"],
        "flags_threads_bad": [1, "--threads", "-2"],
    }
    lines.update({
        "experiment_saturation": [0, "experiment", "saturation", "--n", "10", "--d", "1,2,4", "--trials", "5",
                                  "--seed", "3", "--format", "json", "--out", "r.json", "--resume"],
        "experiment_unknown": [0, "experiment", "frobnicate"],
        "experiment_bad_flag": [0, "experiment", "variance", "--bogus", "1"],
        "experiment_bad_trials": [0, "experiment", "variance", "--trials", "-5"],
    })
    for name, args in lines.items():
        put("cli_args_fuzz", name, bytes([args[0]]) + "\n".join(args[1:]).encode())
    # Mode 2: the byte after the mode picks the experiment (index in the registry).
    exp_flags = {
        "lab_moments": (0, ["--d", "1,2,3"]),
        "lab_variance": (1, ["--d", "1,8,64", "--scaling", "none,sqrt", "--dist", "normal,uniform", "--sigma", "2"]),
        "lab_saturation": (2, ["--n", "5,50", "--d", "1,1000", "--scaling", "log-n,qk-norm", "--sampler", "wishart"]),
        "lab_gradients": (3, ["--d", "4,x"]),
        "lab_heatmap": (4, ["--n", "50", "--d", "1e3"]),
        "lab_projections": (5, ["--d", "-1"]),
        "lab_length": (6, ["--n", "1,,2"]),
    }
    for name, (index, args) in exp_flags.items():
        put("cli_args_fuzz", name, bytes([2, index]) + b"\n" + "\n".join(args).encode())


def seed_attention():
    rng = np.random.default_rng(2)
    for n in (8, 32, 64, 128, 256, 512, 1024, 2048, 4096):
        for r in range(2):
            put("attention_fuzz", f"random_{n}_{r}", rng.integers(0, 256, n, dtype=np.uint8).tobytes())


if __name__ == "__main__":
    seed_npy()
    seed_cli()
    seed_attention()
