"""What ``make demo > log 2>&1`` leaves in the log: the results table whole, no third-party warnings, no
carriage-return bars (#73). The printing functions themselves, not a whole demo run."""

from __future__ import annotations

import contextlib
import subprocess
import sys


def demo_metrics() -> dict:
    row = {"accuracy": 0.24, "ci95": [0.14, 0.38], "em": 0.1, "f1": 0.21, "prompt_tokens": 412.0,
           "seconds_per_question": 1.93}
    return {"closed_book": {**row, "prompt_tokens": 41.0}, "rag_top3": row,
            "sieve": {**row, "retrieval_rate": 0.62, "graded_out_per_question": 1.2},
            "sieve_whole": {**row, "retrieval_rate": 0.62}, "rag_top2": row}


def test_the_demo_table_printed_into_a_file_keeps_whole_rows(tmp_path, monkeypatch):
    from ragsieve.pipeline import demo
    from ragsieve.progress import results_console

    monkeypatch.delenv("COLUMNS", raising=False)
    log = tmp_path / "log"
    with open(log, "w") as out, contextlib.redirect_stdout(out):
        console = results_console()  # what `ragsieve demo` prints with, its stdout a file
        demo._print_metrics_table(demo.DemoConfig(), 50, demo_metrics(), console)
    text = log.read_text()
    assert "…" not in text and "\r" not in text, text
    for header in ("accuracy (contains)", "95 % CI", "retrieved", "prompt tokens", "s / question"):
        assert header in text, text
    for mode in demo_metrics():
        line = next(line for line in text.splitlines() if f" {mode} " in line)
        assert "[0.140, 0.380]" in line and "1.93" in line, line  # the whole row on one line


SITE = """
import warnings
from ragsieve.cli import quiet_third_parties
quiet_third_parties()
def call_site():
    warnings.warn("The `max_length` property was renamed", DeprecationWarning)
    warnings.warn("3 passages over the window", UserWarning)
call_site()
"""


def test_quiet_commands_hide_a_library_deprecation_raised_at_ragsieve_code_but_not_ragsieve_warnings():
    """sentence-transformers' max_length DeprecationWarning was attributed to ragsieve's line that read the
    property, so the filter keeping ragsieve's own warnings let it through into every `serve` log."""
    # run as a ragsieve module's code: warnings name a line's module by its globals' __name__
    code = f"exec({SITE!r}, {{'__name__': 'ragsieve.rerank.neural'}})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "max_length" not in result.stderr, result.stderr
    assert "3 passages over the window" in result.stderr, result.stderr
