"""How long `make test` takes: the Makefile's pytest command on a fresh clone, with fresh caches.

Clones this checkout's HEAD into a temporary folder, points ``$RAGSIEVE_CACHE`` at an empty one (so the SmolLM2
conversion, ONNX exports and cached indexes are built as on a new machine) and runs the Makefile's ``PYTEST``
command there with this interpreter (the install step is not timed: ``make install`` is its own figure). Records
the wall time, pytest's summary (passed, skipped, ...), the load average before and after (other jobs on the
cores slow it) and the machine. Writes ``bench/results/test_suite.json``. Run it alone on the machine:

    flock /tmp/ragsieve-heavy.lock python bench/test_suite.py
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from ragsieve.machine import machine_info

REPO = Path(__file__).resolve().parents[1]


def pytest_command(makefile: str, workers: str) -> list[str]:
    """The Makefile's ``PYTEST := $(PY) -m pytest ...`` with this interpreter and ``workers``."""
    line = re.search(r"^PYTEST := (.+)$", makefile, flags=re.M).group(1)
    return shlex.split(line.replace("$(PY)", shlex.quote(sys.executable)).replace("$(TEST_WORKERS)", workers))


def summary_counts(output: str) -> dict[str, int]:
    """``{"passed": 611, "skipped": 0, ...}`` from pytest's last line."""
    last = [line for line in output.splitlines() if re.search(r"\d+ (passed|failed)", line)][-1:]
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", last[0])} if last else {}


def slowest_tests(output: str) -> list[dict]:
    """``[{"seconds": 77.1, "phase": "call", "test": "tests/test_fit.py::..."}, ...]`` from ``--durations``."""
    rows = re.findall(r"^(\d+\.\d+)s (call|setup|teardown)\s+(\S+)", output, flags=re.M)
    return [{"seconds": float(sec), "phase": phase, "test": test} for sec, phase, test in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="auto", help="pytest-xdist workers (the Makefile's TEST_WORKERS)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "test_suite.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ragsieve-test-suite-") as tmp:
        clone, cache = Path(tmp) / "ragsieve", Path(tmp) / "cache"
        subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
        command = pytest_command((clone / "Makefile").read_text(), args.workers)
        data = os.environ.get("RAGSIEVE_DATA") or str(REPO.parent / "shared" / "data")  # the clone has no ../shared
        env = {**os.environ, "PYTHONPATH": str(clone), "RAGSIEVE_CACHE": str(cache), "RAGSIEVE_DATA": data,
               "HF_HUB_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
        load_before = [round(x, 2) for x in os.getloadavg()]
        start = time.perf_counter()
        # --durations: which tests make the wall time (pytest prints them; they go into the JSON too)
        proc = subprocess.run([*command, "--durations=25"], cwd=clone, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
    sys.stdout.write(proc.stdout[-6000:])
    counts = summary_counts(proc.stdout)
    result = {"command": " ".join(["pytest", *command[3:]]), "exit_code": proc.returncode, **counts,
              "tests": sum(counts.get(k, 0) for k in ("passed", "failed", "skipped", "xfailed", "xpassed")),
              "seconds": round(seconds, 1), "minutes_seconds": list(divmod(round(seconds), 60)),
              "loadavg_before": load_before,
              "slowest": slowest_tests(proc.stdout), "machine": machine_info(),
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("exit_code", "tests", "seconds", "loadavg_before")}))
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
