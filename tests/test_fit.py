"""`ragsieve fit` end to end on a tiny corpus and QA file with the tiny test models; resume; refusals.

The selection by answers and the endpoint-only fit: tests/test_fit_select.py."""

from __future__ import annotations

import gzip
import json

import pytest

from ragsieve.data.records import Passage, Question
from ragsieve.errors import RagsieveError

TOPICS = ["apples", "rivers", "castles", "comets", "violins", "glaciers", "tigers", "bridges", "lanterns", "deserts",
          "orchids", "harbors", "volcanoes", "falcons", "pianos", "meadows", "canyons", "beetles", "islands", "rockets",
          "puzzles", "kettles", "dolphins", "forests"]


def _corpus() -> list[Passage]:
    return [Passage(f"p{i}", f"This passage is about {t}. {t.capitalize()} are described in detail here.", t)
            for i, t in enumerate(TOPICS)]


KNOWN = set(TOPICS[::2])  # the "LLM" knows every other topic


@pytest.fixture
def fit_inputs(tmp_path, chat_server_factory):
    """An index, a QA file (answer = the topic), and a real loopback OpenAI-compatible server standing
    in for a GPU server of the same model: it answers the labelling prompts, right for half the topics."""
    from ragsieve.retrieve import build_index

    index = tmp_path / "idx"
    build_index(_corpus(), index, kind="bm25")
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": f"q{i:02d}", "question": f"what do you know about {t}?",
                                      "answers": [t]}) + "\n" for i, t in enumerate(TOPICS)))

    def reply(body):  # right for a known topic, or when the topic's passage is in the prompt
        asked = body["messages"][-1]["content"]
        return next((t for t in TOPICS if f"about {t}?" in asked and (t in KNOWN or f"about {t}." in asked)),
                    "I am not sure.")

    server = chat_server_factory(reply)
    return index, qa, f"openai:{server.url}#tiny"


def _fit_yaml(tmp_path, settings: str):
    """A FitConfig file: the tiny test's split and sizes, then ``settings``."""
    config = tmp_path / "fit.yaml"
    config.write_text("split: {train: 0.5, dev: 0.25, test: 0.25}\nmax_new_tokens: 3\nmax_prompt_tokens: 400\n"
                      + settings)
    return config


def test_fit_builds_a_sieve_that_loads_and_resumes(fit_inputs, tmp_path, tiny_llm, tiny_llm_dir,
                                                   tiny_cross_encoder_dir, cli):
    from ragsieve import Sieve

    index, qa, endpoint = fit_inputs
    out, config = tmp_path / "sieve", _fit_yaml(
        tmp_path, f"layers: [1, 2]\ncandidates: 6\nprobe: {{hidden: 8, epochs: 5, lr: 0.01}}\n"
        f"align: {{init: {tiny_cross_encoder_dir}, n_pos: 2, n_neg: 2,"
        f" train: {{lr: 0.001, batch_size: 4, max_length: 64, replay_ratio: 0.5}}}}\n"
        "sentences: {enabled: true, passages: 2, leave_one_out: true, train: {epochs: 1}, guard_questions: 12,"
        " guard_margin: 0.001}\n")
    records = tmp_path / "records"
    result = cli("fit", "--index", index, "--questions", qa, "--llm", tiny_llm_dir, "--out", out,
                 "--config", config, "--gate", "budget=0.5", "--generator", endpoint, "--records", records)
    assert result.code == 0, result.err
    assert "frontier on dev" in result.out and "chosen - best plain" in result.out
    written = json.loads((out / "sieve.json").read_text())
    assert written["llm"] == str(tiny_llm_dir) and written["layer"] in (1, 2)
    metrics = written["metrics"]
    test = metrics["test"]
    assert {"closed_book", "plain_top3", "best_plain", "sieve"} <= set(test)
    assert all(len(m["ci95"]) == 2 for m in test.values())
    # chosen by the LLM's answers on dev: the whole grid, the choice, the test comparison
    selection = metrics["selection"]
    grid = selection["grid"]
    assert selection["n_configurations"] == len(grid) > 20 and selection["plot"] == "frontier.png"
    # sentences pruned per passage and across passages (issue #69), each by zero-shot pairs and by the keep head
    pruned = [r for r in grid if r["prune"] != "off"]
    # a keep head trained on this LLM's sentence labels (issue #71: its gold answers' likelihood) must keep NQ's
    # held-out answer sentences non-inferiorly to the shipped head; 12 questions cannot show it at 0.1 points: left out
    labelled = metrics["sentence_labels"]
    assert labelled["from"] == "answer likelihood" and labelled["head"] is None and labelled["guard"]["n"] == 12
    assert labelled["guard"]["non_inferior"] is False and (out / "work" / "rejected-prune_head.safetensors").is_file()
    assert {r["prune_scorer"] for r in pruned} == {"zero-shot", "prune-head"}
    assert {r["prune_scope"] for r in pruned} == {"passage", "across"}
    assert {r["prune_token_cap"] for r in pruned} == {None, 48, 96}  # across within a token budget too
    assert (out / "frontier.png").is_file()
    assert all({"accuracy", "ci95", "prompt_tokens", "llm_seconds", "frontier_tokens"} <= set(r) for r in grid)
    best = max(r["correct_count"] for r in grid)
    winners = [r for r in grid if r["correct_count"] == best]
    chosen = next(r for r in grid if r["name"] == selection["chosen"])
    assert chosen["correct_count"] == best and chosen["prompt_tokens"] == min(r["prompt_tokens"] for r in winners)
    # a budget policy: every retrieving configuration stays behind its β
    assert all(r["gate"] == "policy" for r in grid if r["k"] > 0)
    # passages help here, so the answers choose retrieval over closed book
    in_sample = selection["in_sample"]
    assert chosen["k"] > 0 and in_sample["chosen"]["accuracy"] > in_sample["closed_book"]["accuracy"]
    harm = metrics["do_no_harm"]
    assert {"p_value", "diff", "ci95", "measurably_worse"} <= set(harm["chosen_vs_best_plain"])
    cache = selection["answer_cache"]
    assert cache["requested"] > cache["unique"] >= cache["answered"]
    shipped = next(r for r in grid if r["name"] == selection["shipped"])
    assert written["top_k"] == shipped["k"] and written["passage_order"] == shipped["placement"]
    assert written["beta"] == (shipped["beta"] if shipped["gate"] != "off" else None)
    assert written["policy"] == ("budget=0.5" if shipped["k"] > 0 else "")
    assert all(f.suffix in {".json", ".safetensors", ".txt", ".jsonl", ".sqlite", ".md", ".png", ""} or f.is_dir()
               for f in out.rglob("*") if "work" not in f.parts)  # weights are safetensors only

    sieve = Sieve.load(out, llm=tiny_llm)
    confidences = {sieve.should_retrieve(f"what do you know about {t}?").confidence for t in TOPICS}
    assert sieve.gate is None or len(confidences) > 1  # the probe reads each question
    ranked = sieve.rerank("what do you know about comets?", _corpus()[:6])
    assert sorted(r.index for r in ranked.results) == list(range(6))
    check = metrics["alignment_check"]  # aligned, then kept only if it ranks answers no worse
    if check["kept"]:
        assert (out / "reranker" / "model.safetensors").is_file()
    else:
        assert not (out / "reranker").exists() and (out / "work" / "reranker-rejected" / "model.safetensors").is_file()
    assert written["reranker"] in (None, "reranker", str(tiny_cross_encoder_dir))
    assert "n" in check and metrics["gate_dev"] is None  # a budget policy: no parity search
    # the forgetting guards it trained with: the start's cosine mix by default, replay of answer-bearing train candidates
    guards = metrics["alignment_guards"]
    assert guards["cosine_mix"] is True and guards["replay_ratio"] == 0.5 and guards["guard"] is True
    trained = out / ("reranker" if check["kept"] else "work/reranker-rejected") / "ragsieve_training.json"
    assert json.loads(trained.read_text())["replay_rows"] > 0
    assert (written["grader"] == "grader") == (shipped["grade"] != "off") and (sieve.grader is not None) == bool(
        written["grader"])
    kept = sieve.filter("what do you know about comets?", _corpus()[:6])
    assert len(kept.selected) == written["top_k"]

    # A finished sieve is not fitted over without --overwrite; a killed fit (its work still in the hidden
    # .sieve.partial) is resumed by the same command, which finds every phase's output and redoes nothing expensive.
    args = ("fit", "--index", index, "--questions", qa, "--llm", tiny_llm_dir, "--out", out, "--config", config,
            "--gate", "budget=0.5", "--generator", endpoint)
    again = cli(*args)
    assert again.code == 2 and "already exists; use --overwrite" in again.err
    out.rename(tmp_path / ".sieve.partial")
    again = cli(*args)
    assert again.code == 0 and json.loads((out / "sieve.json").read_text())["beta"] == written["beta"]
    assert not (tmp_path / ".sieve.partial").exists()

    # the records (answers by prompt digest, shifts by id: no text) let a fit on a new machine skip that work
    answers = [json.loads(line) for line in (records / "answers.jsonl").read_text().splitlines()]
    shifts = [json.loads(line) for line in (records / "shifts.jsonl").read_text().splitlines()]
    assert answers and all(set(r) == {"key", "generation", "seconds"} for r in answers)
    assert shifts and all(set(r) == {"question_id", "conf_q", "inc", "candidate_ids"} for r in shifts)
    sentence_rows = (records / "sentence_shifts.jsonl").read_text().splitlines()
    assert sentence_rows and all(set(json.loads(r)) == {"question_id", "signal", "passage_ids", "spans", "conf_q",
                                                        "conf_top", "alone", "without"} for r in sentence_rows)
    assert not any("know about" in line for line in (records / "answers.jsonl").read_text().splitlines())
    # the candidates' scores by id, per reranker weights: the selection on a new machine ranks nothing again
    from ragsieve.registry import reranker_scores_key

    start_key = {"scoring_key": reranker_scores_key(str(tiny_cross_encoder_dir))}
    assert start_key["scoring_key"].endswith("-best-chunk8")  # scores of one reading never stand in for another
    start_scores = next(m.parent for m in (records / "scores").glob("*/meta.json")
                        if json.loads(m.read_text()) == start_key)

    def scored_rows() -> list[bytes]:
        return [line for shard in sorted(start_scores.glob("candidates.*.jsonl.gz"))
                for line in gzip.decompress(shard.read_bytes()).splitlines()]

    rows_before = scored_rows()
    assert rows_before and not any(b"know about" in line for line in rows_before)
    elsewhere = tmp_path / "sieve-elsewhere"
    moved = cli("fit", "--index", index, "--questions", qa, "--llm", tiny_llm_dir, "--out", elsewhere,
                "--config", config, "--gate", "budget=0.5", "--generator", endpoint, "--records", records)
    assert moved.code == 0, moved.err
    again_written = json.loads((elsewhere / "sieve.json").read_text())
    assert again_written["metrics"]["selection"]["answer_cache"]["answered"] == 0  # every answer from the records
    assert len((records / "shifts.jsonl").read_text().splitlines()) == len(shifts)  # no shift measured again
    assert (records / "sentence_shifts.jsonl").read_text().splitlines() == sentence_rows  # nor a sentence's
    # the head's recorded rejection stands for the same labels and settings: not trained again
    assert json.loads((records / "head_check.json").read_text())["kept"] is False
    assert not (elsewhere / "work" / "keep_head").exists()
    assert again_written["metrics"]["sentence_labels"]["guard"] == labelled["guard"]
    assert scored_rows() == rows_before  # no candidate of the start reranker scored again
    recorded_check = json.loads((records / "align_check.json").read_text())
    assert recorded_check["kept"] == check["kept"] and recorded_check["align_key"]
    if not check["kept"]:  # a rejection recorded elsewhere stands without training again
        assert not (tmp_path / "sieve-elsewhere" / "work" / "reranker-rejected").exists()
        assert again_written["metrics"]["alignment_check"] == check


def test_endpoint_only_fit_learns_preferences_from_answers(fit_inputs, tmp_path, tiny_cross_encoder_dir, cli):
    """No local copy of the LLM: no probe and no gate; the reranker is aligned on what the endpoint answers right
    with (the topic's passage, for the topics it does not know closed-book) vs what it answers wrong with."""
    index, qa, endpoint = fit_inputs
    out, config = tmp_path / "sieve", _fit_yaml(
        tmp_path, f"candidates: 4\nalign: {{init: {tiny_cross_encoder_dir}, n_pos: 1, n_neg: 3, guard: false,"
        f" train: {{lr: 0.001, batch_size: 4, max_length: 64}}}}\n"
        "select: {ks: [0, 1, 2], plain_ks: [1, 2], n_boot: 200}\n"
        "sentences: {enabled: true, passages: 2, order: retriever, leave_one_out: true, train: {epochs: 1},"
        " guard_questions: 12, guard_margin: 0.5}\n")
    result = cli("fit", "--index", index, "--questions", qa, "--llm", endpoint, "--out", out, "--config", config,
                 "--objective", "tokens=400")
    assert result.code == 0, result.err
    written = json.loads((out / "sieve.json").read_text())
    metrics = written["metrics"]
    # issue #71: sentences labelled by the endpoint's answers, no gold annotation. It answers right when a prompt
    # holds "about <topic>.": the first sentence of the topic's passage, alone or in the top context, is the one it
    # needs (label 1); the second ("<Topic> are described in detail here.") it does not need (label 0)
    rows = [json.loads(line) for line in (out / "work" / "sentence_shifts.jsonl").read_text().splitlines()]
    labelled = metrics["sentence_labels"]
    assert labelled["from"] == "answers" and labelled["questions"] == len(rows) >= 10
    unknown = [r for r in rows if TOPICS[int(r["question_id"][1:])] not in KNOWN]
    assert labelled["to_keep"] == len(unknown) >= 4  # BM25 puts the topic's own passage first for each
    for row in rows:
        topic = TOPICS[int(row["question_id"][1:])]
        if topic in KNOWN:
            assert row["conf_q"] == 1.0 and set(row["without"]) == {None}  # right closed-book: nothing to lose
            continue
        own = [f"p{TOPICS.index(topic)}" == pid for pid in row["passage_ids"]]
        if any(own):
            at = 2 * own.index(True)  # two sentences a passage
            assert row["alone"][at: at + 2] == [1.0, 0.0] and row["without"][at: at + 2] == [0.0, 1.0], row
    from ragsieve.prune.head import SentenceKeepHead

    assert labelled["head"] == "prune_head.safetensors" and labelled["head_training"]["chosen_epoch"] == 1
    guard = labelled["guard"]  # measured on NQ's held-out gold passages against the shipped head, kept at 50 points
    assert guard["n"] == 12 and guard["non_inferior"] is True and 0 <= guard["fitted"] <= 1
    from ragsieve.registry import load_reranker

    fitted = load_reranker(str(out / "prune_head.safetensors"))  # a fitted sieve's own head, by its path
    assert isinstance(fitted, SentenceKeepHead) and fitted.folder == SentenceKeepHead().folder
    assert any(r.get("prune_scorer") == "prune_head.safetensors" for r in metrics["selection"]["grid"])  # in the grid
    # a sieve that ships it names it by its file in the sieve folder, wherever the folder goes
    from ragsieve import Sieve

    moved = tmp_path / "moved"
    out.rename(moved)
    (moved / "sieve.json").write_text(json.dumps({**written, "top_k": 1, "pruner": "prune_head.safetensors",
                                                  "prune_max_sentences": 1, "prune_threshold": None}))
    scorer = Sieve.load(moved).stages.pruner.scorer
    assert isinstance(scorer, SentenceKeepHead) and all(
        (a == b).all() for a, b in zip(scorer.branch.state_dict().values(), fitted.branch.state_dict().values()))
    moved.rename(out)
    assert written["llm"] == endpoint and written["probe"] is None and written["beta"] is None
    assert metrics["preferences_from"] == "answers" and metrics["preference_groups"]["train"] >= 2
    assert "no probe, no gate" in metrics["skipped"] and "probe_test_auroc" not in metrics
    assert (out / "reranker" / "model.safetensors").is_file() and written["reranker"] in (None, "reranker")
    assert any(r["order"] == "reranker" for r in metrics["selection"]["grid"])  # the aligned one is in the grid
    assert metrics["selection"]["objective"] == "tokens=400"
    assert metrics["selection"]["prompt_tokens_from"] == "characters / 4"
    # the labelling and preference answers went through the cache: the selection found some of its prompts there
    assert metrics["selection"]["answer_cache"]["hits"] > 0
    assert not (out / "probe").exists()


def test_fit_refuses_bad_policies_before_loading(tmp_path, cli):
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"question": "q", "answers": ["a"]}\n')
    result = cli("fit", "--index", tmp_path, "--questions", qa, "--out", tmp_path / "s", "--gate", "budget=7")
    assert result.code == 2 and "gate policy" in result.err


def test_qa_file_errors_are_one_line(tmp_path):
    from ragsieve.data.qa_files import read_qa_file

    bad = tmp_path / "qa.jsonl"
    for text, message in [('{"answers": ["a"]}\n', "qa.jsonl:1: needs a non-empty 'question'"),
                          ('{"question": "q", "answers": []}\n', "qa.jsonl:1: needs 'answers'"),
                          ('{"id": "a", "question": "q", "answer": "x"}\n{"id": "a", "question": "r", "answer": "y"}\n',
                           "qa.jsonl:2: duplicate id 'a'")]:
        bad.write_text(text)
        with pytest.raises(RagsieveError, match=message):
            read_qa_file(bad)


def test_frugal_fit_on_150_own_corpus_questions_does_not_ship_closed_book(tmp_path, chat_server_factory,
                                                                          tiny_cross_encoder_dir, cli):
    """Issue #70's case at its size: 150 questions over a user's corpus, an LLM that rarely knows the answer
    closed-book (3 %) and often finds it in its passage (20 %). On 29 dev questions closed book looked "not
    measurably worse" and shipped; chosen and estimated on dev + test, a frugal fit keeps retrieving."""
    import hashlib

    from ragsieve.retrieve import build_index

    def bucket(topic: str) -> int:
        return int(hashlib.sha1(topic.encode()).hexdigest(), 16) % 100

    topics = [f"item{i:03d}" for i in range(150)]
    passages = [Passage(f"p{i}", f"The code word of {t} is w{t}. Nothing else is said about {t}.", t)
                for i, t in enumerate(topics)]
    index = tmp_path / "idx"
    build_index(passages, index, kind="bm25")
    qa = tmp_path / "qa.jsonl"
    qa.write_text("".join(json.dumps({"id": f"q{i:03d}", "question": f"what is the code word of {t}?",
                                      "answers": [f"w{t}"]}) + "\n" for i, t in enumerate(topics)))

    def reply(body):
        asked = body["messages"][-1]["content"]
        topic = next(t for t in topics if f"code word of {t}?" in asked)
        known = bucket(topic) < 3 or (bucket(topic) < 20 and f"code word of {topic} is" in asked)
        return f"w{topic}" if known else "I am not sure."

    server = chat_server_factory(reply)
    config = tmp_path / "fit.yaml"  # the split: 96 train / 29 dev / 25 test
    config.write_text("split: {train: 0.64, dev: 0.19, test: 0.17}\nmax_new_tokens: 3\nmax_prompt_tokens: 400\n"
                      f"candidates: 2\nalign: {{init: {tiny_cross_encoder_dir}, n_pos: 1, n_neg: 1, guard: false,"
                      " train: {lr: 0.001, batch_size: 8, max_length: 48}}\ngrade: false\n"
                      "select: {ks: [0, 1, 2], plain_ks: [1, 2], prune_quantiles: [], prune_max_sentences: [1],"
                      " prune_across_sentences: [], prune_scorers: [], n_boot: 200}\n")
    out = tmp_path / "sieve"
    result = cli("fit", "--index", index, "--questions", qa, "--llm", f"openai:{server.url}#own", "--out", out,
                 "--config", config, "--objective", "frugal")
    assert result.code == 0, result.err
    metrics = json.loads((out / "sieve.json").read_text())["metrics"]
    selection = metrics["selection"]
    assert 50 <= selection["n_held_out"] <= 60 and selection["cross_fitted"]["k"] == 5
    # a retrieving configuration answers measurably better than closed book on dev + test together ...
    grid = {r["name"]: r for r in selection["grid"]}
    assert grid["top1, retriever"]["correct_count"] > grid["closed book"]["correct_count"]
    held = metrics["test"]
    assert held["best_plain"]["accuracy"] > held["closed_book"]["accuracy"]
    closed_vs_plain = metrics["do_no_harm"]["chosen_vs_closed_book"]
    assert closed_vs_plain["n"] == selection["n_held_out"]
    # ... so frugal does not ship closed book, and sieve.json says how sure the decision is
    written = json.loads((out / "sieve.json").read_text())
    assert written["top_k"] > 0 and selection["shipped"] != "closed book"
    assert selection["margin"] == metrics["margin"] == 0.02 and isinstance(metrics["decided"], bool)
    assert metrics["do_no_harm"]["power"]["detectable_difference"] > 0
    assert "held-out accuracy, dev + test" in result.out


def test_sentence_labels_rise_above_the_questions_typical_sentence():
    """A weak LLM's Conf moves a little for any text: a sentence's label is how far its shift rises above the
    question's median sentence, over the best one's margin (at least min_shift); right / wrong answers stay as they
    are (issue #71)."""
    from ragsieve.fit.sentences import examples_from_row

    passages = [Passage("a", "One. Two."), Passage("b", "Three. Four.")]
    row = {"passage_ids": ["a", "b"], "spans": [[[0, 4], [5, 9]], [[0, 6], [7, 12]]], "conf_q": 0.10,
           "conf_top": 0.30, "alone": [0.12, 0.13, 0.22, 0.12], "without": [0.30, 0.30, 0.25, 0.30]}
    labels = [y for e in examples_from_row(Question("q", "q"), passages, row) for y in e.labels]
    assert labels == pytest.approx([0.0, 0.0526, 1.0, 0.0], abs=1e-3)  # shifts .02 .03 .12 .02 over median .025
    flat = {**row, "alone": [0.12, 0.13, 0.13, 0.12], "without": [None] * 4}  # nothing stands out by 0.05
    assert max(y for e in examples_from_row(Question("q", "q"), passages, flat) for y in e.labels) < 0.25
    answers = {**row, "conf_q": 0.0, "conf_top": 1.0, "alone": [1.0, 1.0, 1.0, 0.0], "without": [1.0] * 4}
    assert [e.labels for e in examples_from_row(Question("q", "q"), passages, answers)] == [(1.0, 1.0), (1.0, 0.0)]
