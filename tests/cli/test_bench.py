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
