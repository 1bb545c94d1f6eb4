"""Feedback store write throughput: SQLite (the embedded default) vs PostgreSQL, 1..N writer processes.

Each writer process appends ``--appends`` feedback items, one per call and so one transaction
per call, as ``POST /v1/feedback`` with one item does (:func:`ragsieve.evolve.live.append_feedback`:
open the store, insert, commit). Writers start together (a start file, so interpreter start-up
is not timed) on a fresh store each run. Reported per backend and writer count: rows/s over the
runs (mean and 95 % t-interval, n = runs: the unit sampled is a run) and the per-call latency
p50/p95 pooled over runs. PostgreSQL is a throwaway server started in a temporary folder
(tools/postgres.py) with fsync on, like SQLite's ``synchronous=FULL``: both wait for the disk
at each commit.
Writes ``bench/results/feedback_store.json``.

    python bench/feedback_store.py [--writers 1 4] [--appends 200] [--runs 5]
    python bench/feedback_store.py --writers 1 2 --appends 20 --runs 2 --out /tmp/fs-smoke.json   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from ragsieve.machine import machine_info

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

_WRITER = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from ragsieve.evolve.live import FeedbackItem, append_feedback
from ragsieve.evolve_db import locate_store
store = locate_store(sys.argv[2], sys.argv[3] or None)
start, w, n = sys.argv[4], sys.argv[5], int(sys.argv[6])
items = [FeedbackItem(query=f"q{w}-{i}", document="a served passage " * 20, label=i % 2, source="bench")
         for i in range(n)]
append_feedback(store, items[:1])  # connect and check the schema once, as a running server has
print("READY", flush=True)
while not os.path.exists(start):
    time.sleep(0.005)
t0, lat = time.time(), []
for item in items[1:]:
    t = time.perf_counter()
    append_feedback(store, [item])
    lat.append(time.perf_counter() - t)
print(json.dumps({"t0": t0, "t1": time.time(), "latency": lat}))
"""


def make_store(folder: Path, url: str | None):
    from ragsieve.evolve_db import locate_store
    from tests.test_feedback_store import make_store as tiny_store

    location = locate_store(folder, url)
    tiny_store(location)
    return location


def one_run(folder: Path, url: str | None, writers: int, appends: int) -> dict:
    location = make_store(folder, url)
    start = folder.parent / f"{folder.name}.start"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(REPO), str(location.dir), url or "", str(start),
                               str(w), str(appends + 1)], stdout=subprocess.PIPE, text=True, env=env)
             for w in range(writers)]
    for p in procs:  # every writer imported and connected, waiting on the start file
        assert p.stdout.readline().strip() == "READY"
    start.touch()
    outs = [json.loads(p.communicate(timeout=600)[0]) for p in procs]
    from ragsieve.evolve.live import pending_feedback

    rows = pending_feedback(location)
    assert rows == writers * (appends + 1), rows  # no row lost
    wall = max(o["t1"] for o in outs) - min(o["t0"] for o in outs)
    return {"rows_per_s": writers * appends / wall, "latency": [x for o in outs for x in o["latency"]]}


def summary(runs: list[dict]) -> dict:
    from scipy import stats

    rates = np.array([r["rows_per_s"] for r in runs])
    lat = np.array([x for r in runs for x in r["latency"]]) * 1000
    half = stats.t.ppf(0.975, len(rates) - 1) * rates.std(ddof=1) / np.sqrt(len(rates)) if len(rates) > 1 else None
    return {
        "runs": len(rates), "rows_per_s": round(float(rates.mean()), 1),
        "rows_per_s_ci95": None if half is None else [round(float(rates.mean() - half), 1),
                                                      round(float(rates.mean() + half), 1)],
        "rows_per_s_each_run": [round(float(x), 1) for x in rates],
        "latency_ms_p50": round(float(np.percentile(lat, 50)), 2), "latency_ms_p95": round(float(np.percentile(lat, 95)), 2),
        "calls": int(lat.size),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--appends", type=int, default=200, help="feedback calls per writer per run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "feedback_store.json")
    args = parser.parse_args()

    from tools.postgres import PostgresServer, skip_reason

    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = None
        if "postgresql" in args.backends:
            if skip_reason():
                sys.exit(f"postgresql: {skip_reason()}")
            server = PostgresServer(fsync=True).start()
        try:
            for backend in args.backends:
                for writers in args.writers:
                    runs = []
                    for run in range(args.runs):
                        folder = Path(tmp) / f"{backend}-{writers}-{run}"
                        url = server.new_database() if backend == "postgresql" else None
                        runs.append(one_run(folder, url, writers, args.appends))
                    results.setdefault(backend, {})[str(writers)] = summary(runs)
                    print(backend, writers, "writers:", json.dumps(results[backend][str(writers)]), flush=True)
        finally:
            if server is not None:
                server.stop()
    report = {
        "what": "feedback rows/s, one append_feedback call (one transaction) per row, fresh store per run",
        "appends_per_writer": args.appends, "results": results,
        "machine": machine_info(),
        "postgres": "throwaway server in a temp folder, fsync on (tools/postgres.py)",
        "command": "python bench/feedback_store.py " + " ".join(sys.argv[1:]),
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
