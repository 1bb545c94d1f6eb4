"""Progress that shows up in a log: plain stderr lines when stderr is not a terminal (issue #41)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.test_fit import TOPICS, fit_inputs  # noqa: F401 - the tiny fit set-up (a fixture)

REPO = Path(__file__).resolve().parents[1]
STATUS = re.compile(r"^(?P<task>.+): (?P<done>[\d,]+)/(?P<total>[\d,]+) \(\d+%\), [\d.,]+/s, \S+ left$")


def _start(*args, cwd: Path) -> tuple[subprocess.Popen, Path]:
    """Start the real command in a child process, stdout and stderr to files in ``cwd`` (not a terminal), as in a
    CI log."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "RAGSIEVE_PROGRESS_SECONDS": "30"}
    cwd.mkdir(parents=True, exist_ok=True)
    with open(cwd / "stdout.log", "w") as out, open(cwd / "stderr.log", "w") as err:
        return subprocess.Popen([sys.executable, "-m", "ragsieve.cli", *map(str, args)], stdout=out, stderr=err,
                                cwd=cwd, env=env), cwd


def _finish(started: tuple[subprocess.Popen, Path]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a command :func:`_start` started."""
    proc, cwd = started
    code = proc.wait(timeout=300)
    return code, (cwd / "stdout.log").read_text(), (cwd / "stderr.log").read_text()


def test_log_lines_by_share_and_by_time(capsys, monkeypatch):
    from ragsieve.progress import LogProgress, progress_bar

    from rich.console import Console
    from rich.progress import Progress

    assert isinstance(progress_bar(), LogProgress)  # pytest's stderr is no terminal
    assert isinstance(progress_bar(Console(stderr=True, force_terminal=True)), Progress)  # a terminal: the bar
    with LogProgress(every_fraction=0.25, every_seconds=3600) as bar:
        task = bar.add_task("encoding", total=100)
        for _ in range(100):
            bar.advance(task, 1)
        resumed = bar.add_task("shifts", total=10, completed=4)
        bar.update(resumed, completed=10)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "encoding: started, 100 to do"
    assert [STATUS.match(x)["done"] for x in lines[1:4]] == ["25", "50", "75"]  # every quarter, not every step
    assert lines[4].startswith("encoding: done, 100/100 in ")
    assert lines[5:7] == ["shifts: started, 4/10 already done", lines[6]] and lines[6].startswith("shifts: done")
    assert len(lines) == 7

    with LogProgress(every_fraction=0.5, every_seconds=3600) as bar:  # one phase, two steps under its name
        task = bar.add_task("fit select")
        bar.update(task, completed=10, total=10)  # the rankings
        bar.update(task, completed=0, total=40)  # the grid: more work under the same name starts again
        bar.update(task, completed=20, total=40)
        bar.update(task, completed=40, total=40)
        bar.update(task, completed=1, total=1)  # the phase's own "done": nothing new to say
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("fit select: done, 10/10")
    assert lines[1] == "fit select: started, 40 to do" and STATUS.match(lines[2])["done"] == "20"
    assert lines[3].startswith("fit select: done, 40/40") and len(lines) == 4

    with LogProgress(every_fraction=0.5, every_seconds=3600) as bar:  # a round's scoring, then the next round's
        task = bar.add_task("score", total=16)
        bar.update(task, completed=16, total=16)
        bar.update(task, completed=8, total=190)  # the next run's first batch: done in this run, not before it
    lines = capsys.readouterr().err.splitlines()
    assert lines[2:] == ["score: started, 190 to do"], lines

    with LogProgress(every_fraction=0, every_seconds=0) as bar:  # a slow task: a line at every report
        task = bar.add_task("training", total=1000)
        bar.advance(task, 1)
        bar.advance(task, 1)
    assert [STATUS.match(x)["done"] for x in capsys.readouterr().err.splitlines()[1:]] == ["1", "2"]


def test_fit_and_index_print_progress_lines_to_a_log(fit_inputs, tmp_path, tiny_llm_dir,  # noqa: F811
                                                     tiny_cross_encoder_dir):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"This passage is about {t}."}) + "\n" for t in TOPICS))
    indexing = _start("index", "--passages", corpus, "--out", tmp_path / "dense", "--kind", "dense",
                      cwd=tmp_path / "index-run")
    index, qa, endpoint = fit_inputs
    config = tmp_path / "fit.yaml"
    config.write_text(
        "split: {train: 0.5, dev: 0.25, test: 0.25}\nlayers: [1]\nmax_new_tokens: 3\nmax_prompt_tokens: 400\n"
        "candidates: 4\nbatch_size: 2\nprobe: {hidden: 8, epochs: 2, lr: 0.01}\n"
        f"align: {{init: {tiny_cross_encoder_dir}, n_pos: 1, n_neg: 1, train: {{lr: 0.001, batch_size: 4, max_length: 64}}}}\n"
    )
    sieve = tmp_path / "sieve"
    fitting = _start("fit", "--index", index, "--questions", qa, "--llm", tiny_llm_dir, "--out", sieve,
                     "--config", config, "--gate", "none", "--generator", endpoint, "--max-questions", 12,
                     cwd=tmp_path / "fit-run")  # beside the index build: two processes, two logs
    code, out, err = _finish(indexing)
    assert code == 0, err
    # the first line says what is built and on which encoder backend (issue #74)
    assert err.startswith("index: building a dense index over 24 passages (encoder on ")
    assert "embedding: started, 24 to do" in err and "embedding: done, 24/24 in " in err
    # stdout holds the result only
    assert " ".join(out.split()) == f"indexed 24 passages from 1 path(s) (dense) → {tmp_path / 'dense'}"

    code, out, err = _finish(fitting)
    assert code == 0, err
    lines = err.splitlines()
    assert lines[0].startswith("fit: questions, index and ") and " loaded in " in lines[0]
    for phase in ("retrieve", "label", "probe", "gate", "prefs", "rerank", "evaluate"):  # each phase starts ...
        assert f"fit {phase}: started" in lines, (phase, err)
    for phase in ("split", "retrieve", "label", "probe", "gate", "prefs", "rerank", "grade", "evaluate"):
        assert any(x.startswith(f"fit {phase}: done, ") for x in lines), (phase, err)  # ... and ends
    # a phase's clock starts when it begins: evaluate starts after select's last line, not at select's first
    # "done" (issue #70: "25/25 in 13m45s" for an evaluate that takes seconds)
    last_select = max(i for i, x in enumerate(lines) if x.startswith("fit select:"))
    assert lines.index("fit evaluate: started") > last_select, err
    within = [m for x in lines if (m := STATUS.match(x)) and m["task"] == "fit label"]
    assert within, err  # within a phase: done/total, rate, time left
    assert "fit " not in out and (sieve / "sieve.json").is_file() and not (tmp_path / ".sieve.partial").exists()
