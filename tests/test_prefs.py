from __future__ import annotations

import json

import numpy as np
import pytest

from ragsieve.data.records import Passage
from ragsieve.errors import DataError
from ragsieve.prefs import confidence_shift, read_preferences, select_preferences, write_preferences
from tests.conftest import requires_data

CANDS = [Passage(f"p{i}", f"text {i}", f"T{i}") for i in range(12)]


def test_select_top_and_bottom_by_inc():
    inc = [0.5, -0.2, 0.1, -0.6, 0.0, 0.3, -0.1, 0.2, 0.4, -0.3, 0.05, -0.05]
    rec = select_preferences("q", CANDS, inc, question_id="q1")
    assert rec.pos_ids == ["p0", "p8", "p5", "p7", "p2"]  # top-5 with Inc > 0, best first
    assert rec.neg_ids == ["p3", "p9", "p1", "p6", "p11"]  # bottom-5 with Inc < 0, worst first
    assert rec.pos_scores == [0.5, 0.4, 0.3, 0.2, 0.1] and rec.neg_scores[0] == -0.6
    assert rec.pos[0] == "T0: text 0"
    assert select_preferences("q", CANDS[:3], [0.1, 0.2, 0.0]) is None  # no negative → dropped
    with pytest.raises(DataError, match="3 candidates but 2"):
        select_preferences("q", CANDS[:3], [0.1, 0.2])


def test_rank_selection_keeps_questions_whose_every_context_raises_confidence():
    """A weak LLM: Conf(Q) ≈ 0, so every Inc is positive; ranking still yields top-5 vs bottom-5."""
    inc = [0.5, 0.02, 0.1, 0.01, 0.03, 0.3, 0.04, 0.2, 0.4, 0.06, 0.05, 0.07]
    assert select_preferences("q", CANDS, inc) is None  # the signed rule drops it
    rec = select_preferences("q", CANDS, inc, signed=False)
    assert rec.pos_ids == ["p0", "p8", "p5", "p7", "p2"] and rec.neg_ids == ["p3", "p1", "p4", "p6", "p10"]
    assert select_preferences("q", CANDS[:9], inc[:9], signed=False) is None  # fewer than 5 + 5 candidates
    assert select_preferences("q", CANDS, [0.1] * 12, signed=False) is None  # no spread


def test_confidence_shift_uses_closed_book_baseline():
    class _Probe:
        def score_batch(self, questions, contexts):
            assert contexts[0] is None and len(questions) == len(contexts) == 3
            return np.array([0.2, 0.7, 0.1])

    np.testing.assert_allclose(confidence_shift(_Probe(), "q", CANDS[:2]), [0.5, -0.1])


def test_round_trip_and_bad_lines(tmp_path):
    rec = select_preferences("q", CANDS[:4], [0.3, -0.2, 0.1, -0.4], question_id="q1")
    path = tmp_path / "prefs.jsonl"
    write_preferences(path, [rec, rec])
    assert read_preferences(path) == [rec, rec]
    row = json.loads(path.read_text().splitlines()[0])
    assert list(row)[:5] == ["query", "pos", "neg", "pos_scores", "neg_scores"]  # FlagEmbedding order
    with path.open("a") as f:
        f.write(json.dumps({"query": "x", "pos": ["a"]}) + "\n")
    with pytest.raises(DataError, match=r"prefs.jsonl:3: 'neg' must be a non-empty list"):
        read_preferences(path)
    assert len(read_preferences(path, skip_bad=True)) == 2
    path.write_text(json.dumps({"query": "x", "pos": ["a"], "neg": ["b"], "pos_scores": [1, 2]}) + "\n")
    with pytest.raises(DataError, match="one score per 'pos'"):
        read_preferences(path)


@requires_data
def test_build_preference_set_resumes(tmp_path, tiny_llm, tiny_llm_dir, monkeypatch):
    """Probe shifts over BM25 candidates → FlagEmbedding files; a rerun loads no LLM."""
    from ragsieve.prefs.build import PreferenceBuildConfig, build_preference_set
    from ragsieve.probe.model import ConfidenceProbe, ProbeConfig, ProbeHead

    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path / "cache"))
    config = ProbeConfig(llm_spec=tiny_llm.spec, layer=2, num_layers=tiny_llm.num_layers,
                         hidden_size=tiny_llm.hidden_size, probe_hidden=8, max_prompt_tokens=400)
    head = ProbeHead(tiny_llm.hidden_size, hidden=8)
    ConfidenceProbe(tiny_llm, head, config).save(tmp_path / "probe")
    cfg = PreferenceBuildConfig(probe=str(tmp_path / "probe"), retriever="bm25", candidates=6, n_pos=2, n_neg=2,
                                train_questions=4, test_questions=2, state_cache=str(tmp_path / "run" / "states.sqlite"))
    stats = build_preference_set(cfg, tmp_path / "prefs")
    assert (tmp_path / "run" / "states.sqlite").stat().st_size > 0  # the given cache, not the user cache
    shifts = [json.loads(line) for line in (tmp_path / "prefs" / "shifts.jsonl").read_text().splitlines()]
    assert [s["split"] for s in shifts] == ["test"] * 2 + ["train"] * 4  # test first
    assert all(len(s["inc"]) == len(s["candidate_ids"]) == 6 for s in shifts)
    for split, n in (("train", 4), ("test", 2)):
        assert stats[split]["questions"] == n
        assert stats[split]["kept"] + sum(stats[split]["dropped"].values()) == n
        recs = read_preferences(tmp_path / "prefs" / f"prefs_{split}.jsonl")
        assert len(recs) == stats[split]["kept"]
        assert all(min(r.pos_scores) > 0 > max(r.neg_scores) and len(r.pos) <= 2 for r in recs)
    monkeypatch.setattr("ragsieve.models.load_local_llm", lambda *a, **k: pytest.fail("resumed run loaded the LLM"))
    assert build_preference_set(cfg, tmp_path / "prefs") == stats
    # commit_dir: a copy without the dataset text; a fresh clone (no work folder, no probe) rebuilds from it
    committed = tmp_path / "committed"
    assert build_preference_set(cfg, tmp_path / "prefs", commit_dir=committed) == stats
    rows = [json.loads(line) for split in ("train", "test")
            for line in (committed / f"prefs_{split}.jsonl").read_text().splitlines()]
    assert len(rows) == stats["train"]["kept"] + stats["test"]["kept"]
    assert all("query" not in r and "pos" not in r and "neg" not in r and r["pos_ids"] for r in rows)
    fresh = cfg.model_copy(update={"probe": str(tmp_path / "no-probe")})
    assert build_preference_set(fresh, tmp_path / "clone-work", commit_dir=committed) == stats
    for split in ("train", "test"):
        assert read_preferences(committed / f"prefs_{split}.jsonl") == \
            read_preferences(tmp_path / "clone-work" / f"prefs_{split}.jsonl")


def test_build_questions_follow_a_probe_split_file(tmp_path):
    """With split_file, train comes from the probe's train + dev ids and test from its test ids, in file order."""
    from types import SimpleNamespace

    from ragsieve.errors import RagsieveError
    from ragsieve.prefs.build import PreferenceBuildConfig, select_build_questions

    questions = [SimpleNamespace(id=f"q{i}") for i in range(10)]
    split = tmp_path / "split.json"
    split.write_text(json.dumps({"train": ["q0", "q1", "q2", "gone"], "dev": ["q3"], "test": ["q9", "q7", "q8"]}))
    cfg = PreferenceBuildConfig(split_file=str(split), train_questions=3, test_questions=2)
    picked = select_build_questions(cfg, questions)
    assert [q.id for q in picked["test"]] == ["q9", "q7"]
    assert len(picked["train"]) == 3 and {q.id for q in picked["train"]} <= {"q0", "q1", "q2", "q3"}
    with pytest.raises(RagsieveError, match="not found"):
        select_build_questions(cfg.model_copy(update={"split_file": str(tmp_path / "none.json")}), questions)
    split.write_text(json.dumps({"dev": []}))
    with pytest.raises(RagsieveError, match="train / test"):
        select_build_questions(cfg, questions)
