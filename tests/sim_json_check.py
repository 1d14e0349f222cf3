#!/usr/bin/env python3
"""Checks `kvrelay sim --json` (tests/CMakeLists.txt, sim_json), from which
scripts/figures renders the README's simulator figures: the report of a
seeded run (`--seeds 1..40`) and of a matrix (`--matrix --kv-mode read`)
hold what the renderers read, with counts that agree.
Usage: sim_json_check.py KVRELAY_BINARY"""
import json
import os
import subprocess
import sys
import tempfile


def report(binary, args, d, name):
    path = os.path.join(d, name)
    subprocess.run([binary, "sim", *args, "--json", path], check=True,
                   stdout=subprocess.DEVNULL)
    with open(path) as f:
        return json.load(f)


with tempfile.TemporaryDirectory() as d:
    seeds = report(sys.argv[1], ["--seeds", "1..40", "--jobs", "2"], d, "seeds.json")
    matrix = report(sys.argv[1], ["--matrix", "--kv-mode", "read"], d, "matrix.json")

assert seeds["mode"] == "seeds", seeds["mode"]
assert seeds["seeds_listed"] == 40, seeds["seeds_listed"]
assert seeds["passed"] == 40 and seeds["failed"] == 0 and seeds["unfinished"] == [], seeds
assert seeds["jobs"] == 2 and seeds["wall_s"] > 0 and seeds["events"] > 0, seeds
assert seeds["required_marks"] == 0 and seeds["missing_marks"] == [], seeds
assert seeds["coverage"].get("crash", 0) > 0, seeds["coverage"]

assert matrix["mode"] == "matrix", matrix["mode"]
runs = matrix["runs"]
assert len(runs) == matrix["passed"] + matrix["failed"] and matrix["failed"] == 0, matrix
assert len({r["case"] for r in runs}) == 27, sorted({r["case"] for r in runs})
assert all(r["kv_mode"] == "read" and r["stream"] == "off" for r in runs)
assert all(r["passed"] and r["blocks_left"] == 0 and r["call_latency_s"] >= 0 for r in runs)
print(f"sim_json: {seeds['passed']} seeds and {len(runs)} matrix runs reported consistently")
