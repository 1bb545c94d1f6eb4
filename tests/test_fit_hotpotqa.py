"""bench/fit.py --dataset hotpotqa (issue #39): the QA file, the index over the distractor paragraphs, the split.

No LLM and no encoder: a 20-question slice of the 1,517-question file, indexed with BM25 (the fit's hybrid
index is the same passages with a dense part), through the same cache the fit reuses.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SHARED_DATA, requires_data

HOTPOT_FILE = "hotpotqa/hotpot_dev_distractor_1517.jsonl.gz"


@pytest.fixture(scope="module")
def fit_bench():
    spec = importlib.util.spec_from_file_location("fit_bench", REPO / "bench" / "fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def hotpot_slice(tmp_path, monkeypatch) -> tuple[Path, list[dict]]:
    """A data folder holding the first 20 questions of the 1,517-question file; indexes cached under tmp_path."""
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path / "cache"))
    with gzip.open(SHARED_DATA / HOTPOT_FILE, "rt", encoding="utf-8") as f:
        rows = [json.loads(next(f)) for _ in range(20)]
    data = tmp_path / "data"
    (data / "hotpotqa").mkdir(parents=True)
    with gzip.open(data / HOTPOT_FILE, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return data, rows


@requires_data
def test_hotpotqa_qa_file_and_index_hold_every_gold_paragraph(fit_bench, hotpot_slice, tmp_path, cli):
    from ragsieve.data.qa_files import read_qa_file
    from ragsieve.retrieve import load_index

    data, rows = hotpot_slice
    excluded = {rows[0]["_id"], rows[5]["_id"]}
    out = tmp_path / "fit"
    prepared = fit_bench.prepare("hotpotqa", out, 0, excluded, kind="bm25", data_dir=data)

    kept = [row for row in rows if row["_id"] not in excluded]
    lines = [json.loads(line) for line in prepared["qa"].read_text().splitlines()]
    assert lines == [{"id": r["_id"], "question": r["question"], "answers": [r["answer"]]} for r in kept]
    assert [q.id for q in read_qa_file(prepared["qa"])] == [r["_id"] for r in kept]
    assert prepared["questions"] == 18 and not prepared["reused"]

    index = load_index(prepared["index"])
    paragraphs = {p.meta.get("doc_id", p.id) for p in index.passages}
    assert any(p.id != p.meta.get("doc_id", p.id) for p in index.passages)  # long paragraphs were chunked
    for row in rows:
        assert {title for title, _ in row["supporting_facts"]} <= paragraphs, row["_id"]
        assert {title for title, _ in row["context"]} <= paragraphs, row["_id"]

    # the same passages `ragsieve index --passages` builds from the corpus file the fit wrote
    r = cli("index", "--passages", out / "passages.jsonl", "--out", tmp_path / "cli-index", "--kind", "bm25")
    assert r.code == 0, r.err
    by_cli = load_index(tmp_path / "cli-index").passages
    assert [(p.id, p.title, p.text) for p in by_cli] == [(p.id, p.title, p.text) for p in index.passages]

    again = fit_bench.prepare("hotpotqa", tmp_path / "fit2", 5, excluded, kind="bm25", data_dir=data)
    assert again["reused"] and again["index"] == prepared["index"] and again["questions"] == 5


@requires_data
def test_hotpotqa_questions_are_those_the_start_reranker_never_saw(fit_bench):
    """embedded:base mined 1,000 of the 1,517 questions: the other 517 split 102 / 111 / 304 (≥ 300 test)."""
    from ragsieve.benchmarks.mining import hotpot_1517
    from ragsieve.data.qa_files import split_questions

    trained = fit_bench.start_reranker_trained("hotpotqa", "embedded:base")
    questions = [q for q in hotpot_1517().questions if q.id not in trained]
    assert len(trained) == 1000 and len(questions) == 517
    shares = dict(zip(("train", "dev", "test"), map(float, fit_bench.HOTPOTQA_SPLIT.split(","))))
    sizes = {name: len(qs) for name, qs in split_questions(questions, shares, 0).items()}  # the fit's split, seed 0
    assert sizes == {"train": 102, "dev": 111, "test": 304}


def test_nq_questions_skip_the_demo_and_the_start_reranker(fit_bench):
    """NQ's refit (issue #39, 1,086 questions, split 241 / 326 / 519): neither the demo's held-out questions nor
    the 1,000 embedded:base mined."""
    from ragsieve.data import held_out_questions, load_dataset
    from ragsieve.data.qa_files import split_questions

    trained = fit_bench.start_reranker_trained("nq", "embedded:base")
    _, _, questions = fit_bench.nq_inputs(0, trained)
    held_out = {q.id for q in held_out_questions(load_dataset("nq-oracle").questions, 0.2, 0)}
    ids = {q.id for q in questions}
    assert len(trained) == 1000 and len(ids) == 1086 and not ids & (trained | held_out)
    sizes = {name: len(qs) for name, qs in split_questions(questions, {"train": 0.2, "dev": 0.3, "test": 0.5}, 0).items()}
    assert sizes == {"train": 241, "dev": 326, "test": 519}


def test_hotpotqa_refuses_ship_and_regrade(fit_bench, monkeypatch, capsys):
    for flag in ("--ship", "--regrade"):
        monkeypatch.setattr(sys, "argv", ["fit.py", "--dataset", "hotpotqa", flag])
        with pytest.raises(SystemExit) as exit_info:
            fit_bench.main()
        assert exit_info.value.code == 2
        assert "shipped NQ default sieve" in capsys.readouterr().err
