"""The evolving reranker on the user's own data (issue #42): own-data init and template checks,
served traffic as unlabelled rounds, feedback before any unlabelled round, the labeller check.

Real SQLite, a real loopback server and the tiny test LLM; no mocks.
"""

from __future__ import annotations

import json
import sqlite3

import httpx
import numpy as np
import pytest

from ragsieve.errors import RagsieveError
from ragsieve.serve import ServeConfig, create_app
from ragsieve.serve.runner import BackgroundServer
from tests.conftest import REPO, requires_data

ROWS = [
    ("is it the fox?", "the fox jumps over the lazy dog", 1),
    ("is it the fox?", "the dog sleeps in the sun", 0),
    ("who wrote hamlet?", "William Shakespeare wrote Hamlet.", 1),
    ("who wrote hamlet?", "Paris is the capital of France.", 0),
    ("capital of france?", "Paris is the capital of France.", "true"),
    ("capital of france?", "the quick brown fox", "false"),
    ("is it the dog?", "the lazy dog sleeps", True),
    ("is it the dog?", "Hamlet is a tragedy.", False),
]


def write_rows(path, rows=ROWS, **extra) -> str:
    path.write_text("".join(json.dumps({"query": q, "passage": p, "label": y, **extra}) + "\n" for q, p, y in rows))
    return str(path)


def one_line_error(result, *needles: str) -> None:
    assert result.code == 2, result.out + result.err
    assert len(result.err.strip().splitlines()) == 1, result.err
    for needle in needles:
        assert needle in result.err, result.err


# --------------------------------------------------------------------------- templates and rows


def test_user_template_file_is_validated_with_one_line_errors(tmp_path):
    from ragsieve.prompts.verdicts import get_template, load_template_file, resolve_template

    good = tmp_path / "mine.yaml"
    good.write_text('template: "Question: {query} Passage: {passage} Title: {title} Answer:"\n'
                    'true_word: "yes"\nfalse_word: "no"\n')
    t = load_template_file(good)
    assert (t.name, t.fields, t.truncate, t.query_field) == ("mine", ("query", "passage", "title"), "passage", "query")
    assert resolve_template(str(good)) == t and resolve_template("relevance") == get_template("relevance")
    cases = {
        'template: "Q: {query} Answer:"\ntrue_word: "yes"\nfalse_word: "no"\n': "'passage' is not a template field",
        'template: "Q: {query} P: {passage"\ntrue_word: "yes"\nfalse_word: "no"\n': "not a valid format string",
        'template: "Q: {query} P: {passage}"\ntrue_word: "yes"\nfalse_word: "yes"\n': "must differ",
        'template: "Q: {query} P: {passage}"\ntrue_word: "yes"\n': "lacks key(s) ['false_word']",
        'template: "Q: {query} P: {passage}"\ntrue_word: "yes"\nfalse_word: "no"\ncolour: red\n': "unknown key(s)",
        'template: "Q: {query} P: {passage[0]}"\ntrue_word: "yes"\nfalse_word: "no"\n': "plain names",
    }
    for text, needle in cases.items():
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(RagsieveError, match=None) as info:
            load_template_file(bad)
        assert needle in str(info.value) and "\n" not in str(info.value), (text, str(info.value))


def test_label_words_must_be_single_tokens_for_the_llm(tiny_llm):
    from ragsieve.prompts.verdicts import check_single_token_words, get_template

    yes_no = get_template("pubmedqa")  # yes / no: one token each for the tiny BPE, as for SmolLM2
    check_single_token_words(tiny_llm.tokenizer, yes_no, tiny_llm.format_prompt)
    with pytest.raises(RagsieveError, match="true_word 'SUPPORTS' is [0-9]+ tokens"):
        check_single_token_words(tiny_llm.tokenizer, get_template("fever"), tiny_llm.format_prompt)


def test_bad_rows_and_bad_options_are_one_line_errors_before_any_store_exists(tmp_path, tiny_llm_dir, cli):
    store = tmp_path / "store"
    init = ("evolve", "init", "--store", store, "--llm", tiny_llm_dir)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"query": "q", "passage": "p", "label": 1}) + "\n"
                    + json.dumps({"query": "q", "label": 0}) + "\n")
    one_line_error(cli(*init, "--examples", rows), f"{rows}:2", "'passage'")
    rows.write_text(json.dumps({"query": "q", "passage": "p", "label": "maybe"}) + "\n")
    one_line_error(cli(*init, "--examples", rows), f"{rows}:1", "label 'maybe'")
    titled = tmp_path / "titled.yaml"
    titled.write_text('template: "Q: {query} T: {title} P: {passage} A:"\ntrue_word: "yes"\nfalse_word: "no"\n')
    one_line_error(cli(*init, "--examples", write_rows(tmp_path / "r.jsonl"), "--template", titled),
                   ":1", "needs field 'title'")
    wordy = tmp_path / "wordy.yaml"
    wordy.write_text('template: "Q: {query} P: {passage} A:"\ntrue_word: "SUPPORTS"\nfalse_word: "REFUTES"\n')
    one_line_error(cli(*init, "--examples", write_rows(tmp_path / "r.jsonl"), "--template", wordy), "single-token")
    one_line_error(cli(*init), "either --examples")
    one_line_error(cli(*init, "--examples", rows, "--dataset", "fever"), "either --examples")
    one_line_error(cli(*init, "--examples", write_rows(tmp_path / "r.jsonl"), "--template", "nope"),
                   "no verdict template 'nope'")
    assert not store.exists()


def test_own_rows_with_extra_template_fields_and_a_test_split(tmp_path, tiny_llm_dir, cli):
    from ragsieve.evolve.store import EvolveStore, store_status

    titled = tmp_path / "titled.yaml"
    titled.write_text('template: "Q: {query} T: {title} P: {passage} A:"\ntrue_word: "yes"\nfalse_word: "no"\n')
    store = tmp_path / "store"
    result = cli("evolve", "init", "--store", store, "--llm", tiny_llm_dir, "--test-size", 2,
                 "--examples", write_rows(tmp_path / "r.jsonl", title="T"), "--template", titled)
    assert result.code == 0 and "SFT set 6, test split 2" in result.out, result.out + result.err
    s = EvolveStore(store)
    try:
        cfg = s.config
        assert cfg.template == "titled" and cfg.template_spec["template"].startswith("Q: {query} T: {title}")
        assert all(x.fields["title"] == "T" for x in s.examples(0))
        test = s.test_examples()
        assert sorted(x.label for x in test) == [0, 1]  # balanced, whole queries
        assert not {x.query_id for x in test} & {x.query_id for x in s.examples(0)}
    finally:
        s.close()
    assert store_status(store)["test_examples"] == 2


# --------------------------------------------------------------------------- feedback first, traffic


def _store_with_a_queued_unlabelled_round(path):
    from ragsieve.data.records import LabeledPair
    from ragsieve.evolve.store import EvolveStoreConfig, init_store
    from ragsieve.prompts.verdicts import get_template

    t = get_template("relevance")

    def pair(i, q, p, y):
        return LabeledPair(f"x{i}", q, q, p, y, t.fields_for(q, p), dataset="relevance")

    initial = [pair(i, q, p, int(y in (1, True, "true"))) for i, (q, p, y) in enumerate(ROWS)]
    queued = [pair(100 + i, "q", f"d{i}", -1) for i in range(3)]  # like a benchmark round: labels hidden
    return init_store(path, EvolveStoreConfig(template="relevance", max_traffic=4), initial, [queued])


def test_feedback_goes_ahead_of_queued_unlabelled_rounds(tmp_path):
    from ragsieve.evolve.live import FeedbackItem, append_feedback, promote_feedback, promote_traffic
    from ragsieve.evolve.live import append_traffic
    from ragsieve.evolve.store import store_status

    store = _store_with_a_queued_unlabelled_round(tmp_path / "store")
    assert [q["round"] for q in store_status(store)["queued"]] == [0, 1]
    with sqlite3.connect(store / "evolve.sqlite") as conn:  # pretend round 0 ran: it is not what is tested here
        conn.execute("INSERT INTO rounds VALUES (0, 'sft', NULL, '{}', 'now')")
    append_feedback(store, [FeedbackItem(query="q", document="good", label=1)])
    assert promote_feedback(store) == 1  # ahead of the queued unlabelled round, which moves back
    append_traffic(store, [("q", "served")])
    assert promote_traffic(store) == 3  # traffic queues last
    append_feedback(store, [FeedbackItem(query="q", chosen="a", rejected="b")])
    assert promote_feedback(store) == 2  # after the earlier feedback round, before both unlabelled rounds
    queued = store_status(store)["queued"]
    assert queued == [{"round": 1, "examples": 1, "feedback": 1}, {"round": 2, "examples": 2, "feedback": 2},
                      {"round": 3, "examples": 3, "feedback": 0}, {"round": 4, "examples": 1, "feedback": 0}]
    with sqlite3.connect(store / "evolve.sqlite") as conn:
        assert conn.execute("SELECT round FROM live_traffic").fetchall() == [(4,)]
        assert sorted(r[0] for r in conn.execute("SELECT DISTINCT round FROM live_feedback")) == [1, 2]


def test_traffic_is_deduplicated_bounded_and_becomes_an_unlabelled_round(tmp_path):
    from ragsieve.evolve.live import TrafficLog, promote_traffic
    from ragsieve.evolve.store import EvolveStore

    store = _store_with_a_queued_unlabelled_round(tmp_path / "store")  # max_traffic = 4
    log = TrafficLog(store)
    log.record("q1", ["a", "b"])
    log.record("q1", ["a", "b", "c"])  # a and b again: logged once
    log.flush()
    assert log.written == 3
    log.record("q2", ["d", "e", "f"])  # only one slot left before the next round
    log.close()
    assert log.written == 4 and log.dropped == 0
    round_id = promote_traffic(store)
    assert round_id == 2 and promote_traffic(store) is None
    s = EvolveStore(store)
    try:
        got = [(x.query, x.passage, x.label, x.fields) for x in s.examples(round_id)]
    finally:
        s.close()
    assert got[0] == ("q1", "a", -1, {"query": "q1", "passage": "a"}) and len(got) == 4
    with pytest.raises(ValueError, match="needs feedback_store"):
        ServeConfig(reranker="bm25", log_traffic=True)


def test_served_requests_are_logged_when_asked_and_only_then(tmp_path):
    store = _store_with_a_queued_unlabelled_round(tmp_path / "store")
    body = {"query": "who wrote hamlet", "documents": ["Shakespeare wrote Hamlet.", "Paris"]}
    with BackgroundServer(create_app(ServeConfig(reranker="bm25", feedback_store=str(store)))) as server:
        assert httpx.post(f"{server.url}/v1/rerank", json=body).status_code == 200
    app = create_app(ServeConfig(reranker="bm25", feedback_store=str(store), log_traffic=True))
    with BackgroundServer(app) as server:
        for path in ("/v1/rerank", "/v2/rerank", "/rerank"):
            assert httpx.post(f"{server.url}{path}", json=body).status_code == 200
        app.state.serve.traffic.flush()
    with sqlite3.connect(store / "evolve.sqlite") as conn:
        rows = conn.execute("SELECT query, document, round FROM live_traffic ORDER BY id").fetchall()
    assert rows == [("who wrote hamlet", "Shakespeare wrote Hamlet.", None), ("who wrote hamlet", "Paris", None)]


# --------------------------------------------------------------------------- the labeller check


class FixedJudge:
    def __init__(self, name, votes):
        self.name, self.vote_of = name, votes

    def votes(self, examples):
        return [self.vote_of.get(x.id) for x in examples]


def test_labeller_check_uses_wilson_against_the_majority_share():
    import doctest

    from ragsieve.data.records import LabeledPair
    from ragsieve.evolve import judges as judges_module
    from ragsieve.evolve.judges import SELF_LABELLER, check_labellers

    assert doctest.testmod(judges_module).failed == 0
    items = [LabeledPair(f"e{i}", f"e{i}", "q", "p", int(i % 4 != 0)) for i in range(40)]  # 75 % label 1
    right = FixedJudge("right", {x.id: x.label for x in items})
    yes_man = FixedJudge("always-true", {x.id: 1 for x in items})  # 0.75 accurate = the majority share
    shy = FixedJudge("shy", {x.id: x.label for x in items[:3]})  # right, but on 3 examples only
    model = {x.id: (x.label, 0.95) for x in items[:20]} | {x.id: (1 - x.label, 0.6) for x in items[20:]}
    check = check_labellers(items, [right, yes_man, shy], model, tau=0.9)
    rows = {r["labeller"]: r for r in check["labellers"]}
    assert check["used"] == ["right", SELF_LABELLER] and check["n_labelled"] == 40
    assert rows["always-true"]["accuracy"] == 0.75 and rows["always-true"]["chance"] == 0.75
    assert rows["shy"]["n"] == 3 and rows["shy"]["low"] < rows["shy"]["chance"]
    assert rows[SELF_LABELLER]["n"] == 20  # its unconfident (and wrong) verdicts are not its labels
    empty = check_labellers([], [right], {}, tau=0.9)
    assert empty["used"] == [] and all(r["n"] == 0 for r in empty["labellers"])


def test_checked_cautious_dpo_checks_on_a_labelled_sample_of_each_batch():
    from ragsieve.data.records import LabeledPair
    from ragsieve.evolve.methods import CheckedCautiousDPO, MethodConfig, build_method, check_sample
    from ragsieve.models.verdict import VerdictScores

    items = [LabeledPair(f"e{i:02d}", f"e{i:02d}", "q", "p", i % 2) for i in range(60)]
    sample = check_sample(items, 10, "1")
    assert len(sample) == 10 and sum(x.label for x in sample) == 5 and sample == check_sample(items, 10, "1")
    p = np.full(60, 0.6)  # never confident: the model is not a labeller here
    verdicts = VerdictScores(np.log(p), np.log(1 - p))
    right, wrong = FixedJudge("right", {x.id: x.label for x in items}), FixedJudge("wrong", {x.id: 1 for x in items})
    method = build_method(MethodConfig(kind="checked-cautious-dpo", tau=0.9), [right, wrong])
    assert isinstance(method, CheckedCautiousDPO)
    method.check_size = 40
    out = method.label(items, verdicts, 1, {})
    assert out.stats["labeller_check"]["used"] == ["right"] and out.stats["accuracy"] == 1.0
    alone = build_method(MethodConfig(kind="checked-cautious-dpo", tau=0.9), [wrong])
    skipped = alone.label(items, verdicts, 1, {})
    assert skipped.pairs == [] and "no labeller clears chance on 50 labelled examples" in skipped.stats["skipped"]


def test_an_unchecked_model_neither_self_labels_nor_votes():
    from ragsieve.data.records import LabeledPair
    from ragsieve.evolve.methods import MethodConfig, build_method
    from ragsieve.models.verdict import VerdictScores

    items = [LabeledPair(f"e{i}", f"e{i}", "q", "p", i % 2) for i in range(4)]
    p = np.array([0.99, 0.01, 0.6, 0.4])
    verdicts = VerdictScores(np.log(p), np.log(1 - p))
    judge = FixedJudge("j", {"e0": 0, "e2": 0})
    method = build_method(MethodConfig(kind="cautious-dpo", tau=0.9), [judge])
    method.trust_self = False
    got = {pr.example.id: (pr.label, pr.source) for pr in method.label(items, verdicts, 1, {}).pairs}
    assert got == {"e0": (0, "jury"), "e2": (0, "jury")}  # the judge alone; e1, e3: no vote, no label


# --------------------------------------------------------------------------- the whole loop


def test_own_data_serve_feedback_step_reload_changes_the_fed_back_scores(tmp_path, tiny_llm_dir, cli):
    """init from rows → serve with --log-traffic → feedback over HTTP → step (feedback first) → reload."""
    from ragsieve.evolve.store import EvolveStore, store_status

    store = tmp_path / "store"
    config = tmp_path / "store.yaml"
    config.write_text(json.dumps({"m0_train": {"lr": 2e-2, "epochs": 1, "batch_size": 4},
                                  "train": {"lr": 5e-2, "batch_size": 4, "epochs": 2}}))
    result = cli("evolve", "init", "--store", store, "--llm", tiny_llm_dir, "--examples",
                 write_rows(tmp_path / "rows.jsonl"), "--test-size", 2, "--max-prompt-tokens", 200,
                 "--config", config)
    assert result.code == 0, result.err
    first = cli("evolve", "step", "--store", store)
    assert first.code == 0 and "round 0 (sft): 6 examples, 6 accepted labels" in first.out, first.out + first.err
    assert "test accuracy" in first.out and "(n = 2)" in first.out

    query, docs = "is it the fox?", ["the fox jumps over the lazy dog", "Paris is the capital of France."]
    body = {"query": query, "documents": docs}
    app = create_app(ServeConfig(reranker=f"evolve:{store}", feedback_store=str(store), log_traffic=True))
    with BackgroundServer(app) as server:
        before = httpx.post(f"{server.url}/v1/rerank", json=body, timeout=120).json()["results"]
        traffic = {"query": "who wrote hamlet?", "documents": ["Hamlet is a tragedy.", "the dog sleeps"]}
        assert httpx.post(f"{server.url}/v1/rerank", json=traffic, timeout=120).status_code == 200
        feedback = [{"query": query, "chosen": docs[0], "rejected": docs[1], "source": "ui"}] * 3
        assert httpx.post(f"{server.url}/v1/feedback", json=feedback).json()["stored"] == 6
        app.state.serve.traffic.flush()
        step = cli("evolve", "step", "--store", store)
        assert step.code == 0, step.out + step.err
        lines = step.out.splitlines()
        assert "live feedback queued as round 1" in lines[0] and "served traffic queued as round 2" in lines[1]
        assert lines[2].startswith("round 1 (feedback): 6 examples, 6 accepted labels,") and "test accuracy" in lines[2]
        assert httpx.post(f"{server.url}/admin/reload", timeout=120).status_code == 200
        after = httpx.post(f"{server.url}/v1/rerank", json=body, timeout=120).json()["results"]
    score = {r["index"]: r["relevance_score"] for r in before}
    new = {r["index"]: r["relevance_score"] for r in after}
    assert new != score
    assert new[0] - new[1] > score[0] - score[1]  # the fed-back preference moved the served scores its way

    # the traffic round: no judge and no confident model verdict clears chance on the feedback → skipped
    third = cli("evolve", "step", "--store", store)
    assert third.code == 0 and "round 2 (skipped): 4 examples, 0 accepted labels" in third.out, third.out
    assert "no labeller clears chance on 6 labelled feedback example(s)" in third.out
    assert "labeller check on 6 labelled feedback example(s): self (confident) " in third.out and "not used" in third.out
    status = cli("evolve", "status", "--store", store)
    assert status.code == 0 and "round 2 skipped: no labeller clears chance" in status.out, status.out
    record = store_status(store)["rounds"][-1]
    assert record["mode"] == "skipped" and record["labeller_check"]["n_labelled"] == 6
    assert record["labeller_check"]["used"] == []
    s = EvolveStore(store)
    try:
        assert len(s.recorded_verdicts()) == 6 + 4  # M_{t-1}'s verdicts on rounds 1 and 2, for later checks
        assert sorted({p.round for p in s.pairs() if p.round > 0}) == [1]
    finally:
        s.close()


# --------------------------------------------------------------------------- the study, on tiny sizes


@requires_data
def test_own_data_study_runs_resumes_and_reports_on_tiny_sizes(tmp_path, tiny_llm_dir, capfd):
    """experiments/evolve_own_data.yaml's code paths with the tiny LLM: file path vs --dataset, the
    checked and unguarded cells, the paired report; a rerun redoes nothing. Run as `ragsieve run` runs
    a study, its training steps and scoring batches show as progress lines in a log (stderr no terminal)."""
    import yaml
    from rich.console import Console

    from ragsieve.config import build_config, read_mapping
    from studies.evolve_own_data import EvolveOwnDataConfig, EvolveOwnDataStudy
    from studies.runner import run_experiment_file

    params = read_mapping(REPO / "experiments" / "evolve_own_data.yaml")["params"]
    build_config(EvolveOwnDataConfig, params)  # the committed config validates
    tiny = {
        **params, "llm": str(tiny_llm_dir), "datasets": ["pubmedqa"], "file_path_dataset": "pubmedqa",
        "rounds": 2, "sizes": {"initial": 8, "per_round": 8}, "size_overrides": {}, "test_size": 8,
        "check_size": 4, "max_prompt_tokens": 300, "m0_train_overrides": {}, "n_boot": 50, "threads": 1,
        "m0_train": {"lr": 2e-2, "epochs": 1, "batch_size": 4}, "train": {"lr": 1e-2, "batch_size": 4},
        "judges": ["reranker:bm25"], "hotpot_source": "sample100",
    }
    cfg = build_config(EvolveOwnDataConfig, tiny)
    out = tmp_path / "out"
    console = Console(file=open(tmp_path / "log.txt", "w"), width=200)
    (tmp_path / "own.yaml").write_text(yaml.safe_dump({"experiment": "evolve_own_data", "out_dir": str(out),
                                                       "params": tiny}))
    capfd.readouterr()
    metrics = run_experiment_file(tmp_path / "own.yaml", console)
    log = capfd.readouterr().err.splitlines()
    assert "train: started, 2 to do" in log and any(x.startswith("train: done, 2/2 in ") for x in log), log
    assert any(x.startswith("score: done, ") for x in log), log
    fp = metrics["file_path"]["pubmedqa"]
    assert fp["n"] == 8 and {"file", "dataset", "mcnemar", "auroc_paired"} <= set(fp)
    assert fp["templates"] == {"dataset": "pubmedqa", "file": "relevance"}
    check = metrics["labeller_check"]["pubmedqa"]
    assert {"m0", "cautious-dpo", "checked-cautious-dpo", "checked_vs_unguarded"} <= set(check)
    rounds = check["checked-cautious-dpo"]["rounds"]
    assert len(rounds) == 2 and all(r["used"] is not None for r in rounds)
    assert not list(out.glob("file_path/*.jsonl")) and (out / "work" / ".gitignore").exists()  # rows stay in work/
    again = EvolveOwnDataStudy().run(cfg, out, console)  # everything finished: nothing reruns
    assert again["file_path"] == metrics["file_path"] and again["labeller_check"] == metrics["labeller_check"]
