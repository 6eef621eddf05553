"""attnscale bench --rows: only the cases asked for are set up and timed, with the limits they use."""
import csv
import io


def test_rows_picks_cases_and_their_limits(run):
    r = run("bench", "--rows", "small-call,peak-scaling", "--rounds", "1", "--format", "csv")
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


def test_short_decode_rows_time_grouped_decode_in_cache(run):
    r = run("bench", "--rows", "kv-short", "--rounds", "1", "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = [row for row in csv.DictReader(io.StringIO(r.stdout)) if row["case"] == "kv-short"]
    shapes = [(row["H"], row["Hkv"], row["Nkv"], row["d"], row["dtype"]) for row in rows]
    assert shapes == [("32", "8", n, "128", t) for n in ("64", "512") for t in ("f32", "bf16")], shapes
    assert all(row["limit"] == "copy-cache" and float(row["ratio"]) > 0 for row in rows), rows


def test_short_decode_rows_from_memory_time_the_same_calls_against_the_copy(run):
    r = run("bench", "--rows", "kv-short-dram", "--rounds", "1", "--format", "csv")
    assert r.returncode == 0, r.stderr
    rows = [row for row in csv.DictReader(io.StringIO(r.stdout)) if row["case"] == "kv-short-dram"]
    shapes = [(row["H"], row["Hkv"], row["Nkv"], row["d"], row["dtype"]) for row in rows]
    assert shapes == [("32", "8", n, "128", t) for n in ("64", "512") for t in ("f32", "bf16")], shapes
    assert all(row["limit"] == "copy" and float(row["ratio"]) > 0 for row in rows), rows
