"""attnscale bench --rows: only the cases asked for are set up and timed, with the limits they use."""
import csv
import io

import pytest


def test_rows_picks_cases_and_their_limits(run):
    r = run("bench", "--rows", "small-call,peak-scaling", "--rounds", "3", "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    cases = [row["case"] for row in rows if row["limit"] != "" or row["unit"] == "us/call"]
    assert cases == ["peak-scaling", "small-call"], cases
    # Limits: the FMA loop on one thread (peak-scaling's) and sgemm (timed every round); none that
    # no row of this run uses (the copies, the bf16 peak).
    limits = {row["case"] for row in rows if row["limit"] == "" and row["unit"] != "us/call"}
    assert limits == {"fma-1thread", "sgemm"}, limits
    scaling = next(row for row in rows if row["case"] == "peak-scaling")
    assert scaling["limit"] == "fma-1thread" and float(scaling["ratio"]) > 0
    # Its limit timed before and after it every round: the rounds where the two agreed, of 3.
    assert scaling["rounds"] == "3" and 0 <= int(scaling["steady_rounds"]) <= 3, scaling
    small = next(row for row in rows if row["case"] == "small-call")
    assert small["rounds"] == small["steady_rounds"] == "", small  # no limit, no bracket


@pytest.mark.parametrize("case, limit", [("kv-short", "copy-cache"), ("kv-short-dram", "copy")])
def test_short_decode_rows_time_grouped_decode_against_their_copy(run, case, limit):
    # kv-short: K and V in cache; kv-short-dram: each call over the next of many copies, from memory.
    r = run("bench", "--rows", case, "--rounds", "1", "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = [row for row in csv.DictReader(io.StringIO(r.stdout)) if row["case"] == case]
    shapes = [(row["H"], row["Hkv"], row["Nkv"], row["d"], row["dtype"]) for row in rows]
    assert shapes == [("32", "8", n, "128", t) for n in ("64", "512") for t in ("f32", "bf16")], shapes
    assert all(row["limit"] == limit and float(row["ratio"]) > 0 for row in rows), rows
    # Rows against the DRAM copy carry their rate over the read stream timed beside it; others none.
    assert all((row["of_read"] != "") == (limit == "copy") for row in rows), rows
    assert all(float(row["of_read"]) > 0 for row in rows if limit == "copy"), rows
