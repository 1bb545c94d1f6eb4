from __future__ import annotations

import json

import pytest

from ragsieve.data.records import Passage
from tests.conftest import requires_data


def test_unknown_dataset_is_one_line(cli):
    r = cli(*["index", "--out", "/tmp/never", "--dataset", "no-such-set"])
    assert r.code == 2, r.err
    err = r.err.strip()
    assert err.startswith("error: unknown dataset 'no-such-set'") and "\n" not in err


def test_missing_data_dir(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("RAGSIEVE_DATA", str(tmp_path / "nowhere"))
    r = cli(*["index", "--out", str(tmp_path / "idx"), "--dataset", "nq-oracle"])
    assert r.code == 2, r.err
    assert "RAGSIEVE_DATA" in r.err


def test_ask_needs_index_or_closed_book(cli):
    r = cli(*["ask", "who wrote hamlet"])
    assert r.code == 2, r.err
    assert "--no-retrieval" in r.err
    r = cli(*["ask", "  ", "--no-retrieval"])
    assert r.code == 2, r.err
    assert "empty question" in r.err


def test_demo_config_with_wrong_key(tmp_path, cli):
    cfg = tmp_path / "demo.yaml"
    cfg.write_text("n_question: 5\n")
    r = cli(*["demo", "--config", str(cfg)])
    assert r.code == 2, r.err
    assert "unknown key 'n_question'" in r.err


def test_report_only_is_refused_in_one_line_where_there_is_nothing_to_report(tmp_path, cli):
    """`ragsieve run --report-only`: an experiment without a report mode, or no out_dir yet, is a one-line error."""
    probe = tmp_path / "probe.yaml"
    probe.write_text(f"experiment: probe_nq\nout_dir: {tmp_path / 'probe'}\n")
    r = cli(*["run", str(probe), "--report-only"])
    assert r.code == 2, r.err
    assert r.err.strip().startswith("error: experiment 'probe_nq' has no report-only mode") and "\n" not in r.err.strip()
    evolve = tmp_path / "evolve.yaml"
    evolve.write_text(f"experiment: evolve\nout_dir: {tmp_path / 'never-run'}\n")
    r = cli(*["run", str(evolve), "--report-only"])
    assert r.code == 2, r.err
    assert "never-run does not exist: nothing to report yet" in r.err
    assert not (tmp_path / "never-run").exists()  # refused before anything is written


@requires_data
def test_index_retrieve_ask_end_to_end(tmp_path, cli, tiny_llm_dir):
    """BM25 index over a real pool, retrieval as JSON, and `ask` with a tiny LLM."""
    out = tmp_path / "idx"
    r = cli(*["index", "--out", str(out), "--dataset", "hotpotqa-distractor", "--kind", "bm25"])
    assert r.code == 0, r.err
    r = cli(*["retrieve", "VIVA Media acronym", "--index", str(out), "-k", "3", "--json"])
    assert r.code == 0, r.err
    rows = [json.loads(line) for line in r.out.splitlines()]
    assert len(rows) == 3 and rows[0]["rank"] == 0
    assert any("VIVA" in r["title"] for r in rows)
    r = cli(*["ask", "What does VIVA stand for?", "--index", str(out), "--llm", str(tiny_llm_dir),
                 "--max-new-tokens", "3", "--show-contexts"])
    assert r.code == 0, r.err


@pytest.mark.integration
@requires_data
def test_eval_retrieval_small(tmp_path, cli):
    out = tmp_path / "r.json"
    r = cli(*["eval-retrieval", "--dataset", "hotpotqa-distractor", "--kinds", "bm25,hybrid", "--ks", "2,10",
                 "--n-questions", "10", "--out", str(out)])
    assert r.code == 0, r.err
    res = json.loads(out.read_text())
    assert set(res["metrics"]) == {"bm25", "hybrid"}
    assert set(res["metrics"]["bm25"]) == {"R@2", "R@10", "MRR@10"}
    assert 0 < res["metrics"]["hybrid"]["R@10"] <= 1


@requires_data
def test_demo_writes_metrics(tmp_path, tiny_llm_dir, monkeypatch, cli):
    monkeypatch.setenv("RAGSIEVE_CACHE", str(tmp_path / "cache"))
    cfg = tmp_path / "demo.yaml"
    cfg.write_text(f"llm: {tiny_llm_dir}\nindex_kind: bm25\nn_questions: 3\nmax_new_tokens: 2\n"
                   f"max_prompt_tokens: 450\nout_dir: {tmp_path / 'out'}\n")
    r = cli(*["demo", "--config", str(cfg)])
    assert r.code == 0, r.err
    res = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert res["n_questions"] == 3 and set(res["metrics"]) == {"closed_book", "rag_top3"}
    for m in res["metrics"].values():
        assert {"accuracy", "em", "f1", "seconds_per_question"} <= set(m)
    assert len((tmp_path / "out" / "predictions.jsonl").read_text().splitlines()) == 6
    assert "rag_top3" in r.out


@requires_data
def test_probe_cli_extract_eval_and_ask_with_cbdr(tmp_path, tiny_llm, tiny_llm_dir, cli):
    import numpy as np

    from ragsieve.probe.model import ConfidenceProbe, ProbeConfig, ProbeHead

    cfg = ProbeConfig(llm_spec=tiny_llm.spec, layer=2, num_layers=tiny_llm.num_layers,
                      hidden_size=tiny_llm.hidden_size, probe_hidden=8, max_prompt_tokens=450)
    ConfidenceProbe(tiny_llm, ProbeHead(tiny_llm.hidden_size, 8), cfg).save(tmp_path / "probe")
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "Who wrote Hamlet?", "correct": 1}\n'
                    '{"question": "Where is Paris?", "context": "Paris is in France.", "correct": 0}\n')
    r = cli(*["probe", "extract", "--input", str(rows), "--out", str(tmp_path / "s.npy"), "--llm",
                 str(tiny_llm_dir), "--layer", "2", "--max-prompt-tokens", "450"])
    assert r.code == 0, r.err
    assert np.load(tmp_path / "s.npy").shape == (2, tiny_llm.hidden_size)
    r = cli(*["probe", "eval", "--input", str(rows), "--probe", str(tmp_path / "probe"), "--llm",
                 str(tiny_llm_dir)])
    assert r.code == 0, r.err
    report = json.loads(r.out.strip().splitlines()[-1])
    assert report["n"] == 2 and 0 <= report["auroc"] <= 1
    rows.write_text('{"question": ""}\n')
    r = cli(*["probe", "eval", "--input", str(rows), "--probe", str(tmp_path / "probe"), "--llm",
                 str(tiny_llm_dir)])
    assert r.code == 2, r.err
    assert "rows.jsonl:1: missing or empty 'question'" in r.err

    index = tmp_path / "idx"
    r = cli(*["index", "--out", str(index), "--dataset", "hotpotqa-distractor", "--kind", "bm25"])
    assert r.code == 0, r.err
    # β = 1.0: Conf(Q) can never exceed it, so the gate must retrieve.
    r = cli(*["ask", "What does VIVA stand for?", "--index", str(index), "--llm", str(tiny_llm_dir),
                 "--max-new-tokens", "2", "--cbdr", "1.0", "--probe", str(tmp_path / "probe")])
    assert r.code == 0, r.err
    assert "→ retrieve" in r.err


def test_rerank_query_train_eval_cli(tmp_path, cli, tiny_cross_encoder_dir):
    """`rerank QUERY` (text, jsonl, bad line, empty), `rerank train` and `rerank eval`."""
    txt = tmp_path / "p.txt"
    txt.write_text("Hamlet is by Shakespeare.\n\nParis is in France.\nHamlet is by Shakespeare.\n")
    r = cli(*["rerank", "who wrote hamlet", "--passages", str(txt), "-r", "bm25", "--json"])
    assert r.code == 0, r.err
    rows = [json.loads(line) for line in r.out.splitlines()]
    assert [r["index"] for r in rows] == [0, 2, 1]  # duplicates kept with their own indices, ties stable
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"text": "ok"}\n{"title": "no text"}\n')
    r = cli(*["rerank", "q", "--passages", str(bad), "-r", "bm25"])
    assert r.code == 2, r.err
    assert f"{bad}:2" in r.err
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    r = cli(*["rerank", "q", "--passages", str(empty), "-r", "bm25", "--json"])
    assert r.code == 0, r.err
    assert r.out == ""

    from ragsieve.prefs import select_preferences, write_preferences

    cands = [Passage(f"p{i}", t) for i, t in enumerate(["Hamlet by Shakespeare", "Paris France", "foxes", "dogs"])]
    rec = select_preferences("who wrote hamlet", cands, [0.4, -0.2, -0.1, 0.1], question_id="q1")
    prefs = tmp_path / "prefs.jsonl"
    write_preferences(prefs, [rec, rec])
    out = tmp_path / "ce"
    cfg = tmp_path / "train.yaml"
    cfg.write_text("batch_size: 2\nmax_length: 64\ngroup_size: 3\n")
    r = cli(*["rerank", "train", "--prefs", str(prefs), "--out", str(out), "--init", str(tiny_cross_encoder_dir),
                 "--config", str(cfg)])
    assert r.code == 0, r.err
    metrics_path = tmp_path / "m.json"
    r = cli(*["rerank", "eval", "--prefs", str(prefs), "-r", "bm25", "-r", str(out), "--ks", "1,2",
                 "--out", str(metrics_path)])
    assert r.code == 0, r.err
    metrics = json.loads(metrics_path.read_text())
    assert set(metrics) == {"bm25", str(out)} and metrics["bm25"]["P@1"] == 1.0
    cfg.write_text("batch_sise: 2\n")
    r = cli(*["rerank", "train", "--prefs", str(prefs), "--out", str(out), "--init", str(tiny_cross_encoder_dir),
                 "--config", str(cfg)])
    assert r.code == 2, r.err
    assert "unknown key 'batch_sise'" in r.err


# ---------------------------------------------------------------- the stages act, seen through `ask`

# BM25 ranks the answer last (keyword overlap); MiniLM cosine ranks it first (0.74 / 0.48 / 0.07).
STAGE_CORPUS = [
    Passage("stuffed", "Hamlet, hamlet, hamlet: a hamlet is a small village. Hamlet villages.", "Hamlet (place)"),
    Passage("answer", "Hamlet is a tragedy written by William Shakespeare around 1600.", "Hamlet"),
    Passage("off", "Photosynthesis converts light energy into chemical energy, says the author.", "Photosynthesis"),
]


@pytest.fixture
def stage_index(tmp_path):
    from ragsieve.retrieve import build_index

    build_index(STAGE_CORPUS, tmp_path / "idx", kind="bm25")
    return tmp_path / "idx"


def _contexts(out: str) -> list[str]:
    """Passage ids `ask --show-contexts` printed, in the order the LLM saw them."""
    return [line.split()[1] for line in out.splitlines() if line.startswith("[")]


def test_ask_reranker_changes_what_reaches_the_llm(stage_index, tiny_llm_dir, cli):
    base = ["ask", "who is the author of hamlet", "--index", stage_index, "--llm", tiny_llm_dir,
            "--max-new-tokens", "2", "--show-contexts", "--top-k", "1", "--candidates", "3"]
    plain = cli(*base)
    assert plain.code == 0, plain.err
    assert _contexts(plain.out) == ["off"]  # BM25's first hit shares "author" with the query
    reranked = cli(*base, "--reranker", "bi-encoder")
    assert reranked.code == 0, reranked.err
    assert _contexts(reranked.out) == ["answer"]  # the reranker moved the answer to the top


def test_ask_grader_drops_the_irrelevant_passage(stage_index, tiny_llm_dir, tmp_path, cli):
    from ragsieve.registry import new_grader

    # MiniLM cosine: 0.74 / 0.48 for the Hamlet passages, 0.07 for the off-topic one
    new_grader("cosine", threshold=0.25).save(tmp_path / "grader")
    base = ["ask", "who is the author of hamlet", "--index", stage_index, "--llm", tiny_llm_dir,
            "--max-new-tokens", "2", "--show-contexts", "--top-k", "3"]
    plain = cli(*base)
    assert plain.code == 0 and set(_contexts(plain.out)) == {"stuffed", "answer", "off"}
    graded = cli(*base, "--grader", tmp_path / "grader")
    assert graded.code == 0, graded.err
    assert "off" not in _contexts(graded.out) and "answer" in _contexts(graded.out)
    assert "graded irrelevant and dropped" in graded.err


def test_ask_refuses_bad_options_before_loading_anything(stage_index, cli):
    result = cli("ask", "q", "--index", stage_index, "--top-k", "0", "--llm", "/no/such/model")
    assert result.code == 2 and "top_k" in result.err and "no/such" not in result.err
    result = cli("ask", "q", "--index", stage_index, "--cbdr", "1.5", "--llm", "/no/such/model")
    assert result.code == 2 and "cbdr_beta" in result.err
    result = cli("ask", "q", "--index", stage_index, "--grader", "embedded:nope")
    assert result.code == 2 and "no grader named 'nope'" in result.err


def test_grade_and_rerank_stream_to_out_and_resume(tmp_path, cli):
    """--out keeps every finished row; a rerun computes only what is missing and prints the same."""
    from ragsieve.registry import new_grader

    passages = tmp_path / "p.txt"
    passages.write_text("".join(f"{p.full_text}\n" for p in STAGE_CORPUS))
    new_grader("cosine", threshold=0.25).save(tmp_path / "grader")
    out = tmp_path / "graded.jsonl"
    first = cli("grade", "who is the author of hamlet", "-p", passages, "-g", tmp_path / "grader", "--json", "--out", out)
    assert first.code == 0, first.err
    assert len(out.read_text().splitlines()) == 3
    lines = out.read_text().splitlines()
    out.write_text("\n".join(lines[:1]) + "\n" + lines[1][:10])  # as a kill mid-write leaves it
    again = cli("grade", "who is the author of hamlet", "-p", passages, "-g", tmp_path / "grader", "--json", "--out", out)
    assert again.code == 0
    # the rerun scores only the 2 missing rows, in a batch of another shape: equal up to float rounding
    rows = lambda out: [json.loads(x) for x in out.splitlines()]  # noqa: E731
    assert [(r["id"], r["relevant"]) for r in rows(again.out)] == [(r["id"], r["relevant"]) for r in rows(first.out)]
    assert [r["score"] for r in rows(again.out)] == pytest.approx([r["score"] for r in rows(first.out)], abs=1e-6)

    ranked = tmp_path / "ranked.jsonl"
    result = cli("rerank", "who is the author of hamlet", "-p", passages, "-r", "bm25", "--json", "--out", ranked)
    assert result.code == 0, result.err
    assert [json.loads(x)["index"] for x in result.out.splitlines()][-1] == 1  # BM25 puts the answer last
    assert cli("rerank", "q", "-p", passages, "-r", "bm25", "-k", "-1").code == 2


def test_index_overwrite_and_option_checks_come_first(tmp_path, cli, monkeypatch):
    existing = tmp_path / "idx"
    existing.mkdir()
    result = cli("index", "--out", existing, "--dataset", "no-such-set")
    assert result.code == 2 and "already exists; use --overwrite" in result.err  # before the dataset is read
    assert "unknown index kind 'faiss'" in cli("index", "--out", tmp_path / "x", "--kind", "faiss").err
    store = tmp_path / "store"
    result = cli("evolve", "init", "--store", store, "--dataset", "pubmedqa", "--rounds", "-3")
    assert result.code == 2 and "--rounds" in result.err and not store.exists()
    monkeypatch.setenv("RAGSIEVE_LLM_TIMEOUT", "0")
    result = cli("ask", "q", "--no-retrieval", "--llm", "openai:http://127.0.0.1:9/v1#m", "--timeout", "-1")
    assert result.code == 2 and "timeout" in result.err


def test_serve_port_out_of_range_is_one_line(cli):
    for port in ("99999", "-1"):
        r = cli("serve", "--port", port)  # refused before any model loads or a socket is made
        assert r.code == 2, r.err
        assert r.err.strip() == f"error: --port {port}: a TCP port is 1-65535 (0 = any free port)"


def test_fit_with_too_few_questions_fails_on_the_split_before_loading_anything(tmp_path, cli):
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": f"q{i}", "question": f"question {i}?", "answers": ["a"]}) + "\n"
                          for i in range(4)))
    # neither the index nor the LLM exists: the split sizes are checked first
    r = cli("fit", "--index", tmp_path / "no-index", "--questions", qa, "--out", tmp_path / "sieve",
            "--llm", tmp_path / "no-llm")
    assert r.code == 2 and "too few questions for the" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert not (tmp_path / "sieve").exists()


@pytest.mark.parametrize("args, says", [
    (("--host", "8.8.8.8"), "--host 8.8.8.8: not an address of this machine"),
    (("--host", "no.such.host.invalid"), "--host no.such.host.invalid: does not resolve"),
    (("--host", "8.8.8.8", "--ray", "local"), "--host 8.8.8.8: not an address of this machine"),
])
def test_serve_on_an_address_not_this_machines_is_one_line_before_any_model_loads(cli, args, says):
    r = cli("serve", "-r", "embedded:base", "--port", "0", *args)
    # one line and nothing else: the "loading embedded:base" line would come first had a model started loading
    assert r.code == 2 and r.err.strip().startswith(f"error: {says}") and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize("ray", [(), ("--ray", "local")], ids=["uvicorn", "ray"])
def test_serve_on_a_port_in_use_is_one_line_before_any_model_loads(cli, ray):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = cli("serve", "-r", "embedded:base", "--port", port, *ray)
    assert r.code == 2 and r.err.strip().startswith(f"error: --port {port}: already in use"), r.err
    assert len(r.err.strip().splitlines()) == 1, r.err
