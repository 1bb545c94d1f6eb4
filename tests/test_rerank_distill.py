"""Issue 40's distillation pipeline on tiny models and hand-made mined rows: teacher scores cached and
resumed, a truncated student trained a few steps, held-out nDCG@10 / paired bootstrap / ECE, the ship step,
and ``embedded:fast`` resolving (or failing in one line)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from ragsieve.errors import ModelNotAvailable
from tests.conftest import requires_data

TOPICS = [
    ("who wrote hamlet", "Hamlet is a tragedy written by William Shakespeare."),
    ("capital of france", "Paris is the capital and largest city of France."),
    ("largest planet", "Jupiter is the largest planet in the Solar System."),
    ("boiling point of water", "Water boils at 100 degrees Celsius at sea level."),
    ("author of war and peace", "War and Peace is a novel by Leo Tolstoy."),
    ("speed of light", "Light travels at about 300,000 kilometres per second."),
    ("tallest mountain", "Mount Everest is the highest mountain above sea level."),
    ("inventor of the telephone", "Alexander Graham Bell patented the first practical telephone."),
]


def _mined_rows() -> list[dict]:
    rows = []
    for i, (query, gold) in enumerate(TOPICS):
        negatives = [t for j, (_, t) in enumerate(TOPICS) if j != i][:5]
        rows.append({"dataset": "fever", "split": "dev" if i >= 6 else "train", "qid": f"q{i}", "query": query,
                     "pos": [[f"p{i}", gold, 0.6]],
                     "neg": [[f"n{i}-{k}", t, 0.1 + 0.05 * k, "dense"] for k, t in enumerate(negatives)]})
    return rows


@pytest.fixture()
def teacher_dir(tmp_path, tiny_cross_encoder_dir):
    folder = tmp_path / "teacher"
    shutil.copytree(tiny_cross_encoder_dir, folder)
    card = {"max_length": 64, "default_backend": "torch", "cosine_weight": 0.25, "cosine_scale": 20.0,
            "calibration": {"temperature": 2.0, "bias": -1.0}}
    (folder / "ragsieve_reranker.json").write_text(json.dumps(card))
    return folder


def _counting_teacher(cross):
    """A teacher scorer (the cross-encoder's raw logits) that counts the pairs it is asked for."""

    class Counting:
        calls = 0

        def predict_pairs(self, pairs):
            Counting.calls += len(pairs)
            return cross.predict_logits(pairs)

    return Counting


def test_teacher_scores_are_the_mixed_logit_and_resume_from_the_cache(tmp_path, teacher_dir):
    from ragsieve.rerank.neural import CrossEncoderRanker
    from ragsieve.rerank.training.distill import cache_teacher_scores, teacher_logit_pairs

    rows = _mined_rows()
    cross = CrossEncoderRanker(str(teacher_dir), max_length=64)

    Counting = _counting_teacher(cross)

    cache = tmp_path / "teacher.jsonl"
    first = cache_teacher_scores(rows[:3], Counting(), cache, 0.25, 20.0, chunk=2)
    logits = cross.predict_logits(teacher_logit_pairs(rows[:1]))
    expected = logits + 0.25 * 20.0 * np.array([d[2] for d in rows[0]["pos"] + rows[0]["neg"]])
    got = [d[2] for d in first[0]["pos"] + first[0]["neg"]]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # raw logits, not sigmoid outputs: the sigmoid of the logit is what predict_pairs answers
    np.testing.assert_allclose(1 / (1 + np.exp(-logits)), cross.predict_pairs(teacher_logit_pairs(rows[:1])), atol=1e-6)
    done = Counting.calls
    with cache.open("a") as fh:
        fh.write('{"key": "fever/q3", "logi')  # a line cut by a kill
    again = cache_teacher_scores(rows, Counting(), cache, 0.25, 20.0)
    assert Counting.calls - done == sum(len(r["pos"]) + len(r["neg"]) for r in rows[3:])  # only the new rows
    assert again[:3] == first


def _record_rows(folder) -> list[dict]:
    import gzip

    return [json.loads(line) for shard in sorted(folder.rglob("*.jsonl.gz"))
            for line in gzip.open(shard, "rt").read().splitlines()]


def test_teacher_records_carry_scores_to_another_machine(tmp_path, teacher_dir, caplog):
    """Committed records of the teacher's logits (ids and scores only): a partial record is reused and only the
    missing pairs are scored; a shard cut by a kill keeps its complete chunks; another teacher's are ignored."""
    from ragsieve.data.score_records import PairScores
    from ragsieve.rerank.neural import CrossEncoderRanker
    from ragsieve.rerank.training.distill import cache_teacher_scores
    from studies.rerank_distill_common import teacher_identity
    from tests.test_repo_hygiene import file_problems

    rows = _mined_rows()
    cross = CrossEncoderRanker(str(teacher_dir), max_length=64)

    Counting = _counting_teacher(cross)

    records, identity = tmp_path / "records" / "teacher", teacher_identity(teacher_dir)
    first = cache_teacher_scores(rows[:3], Counting(), tmp_path / "a" / "t.jsonl", 0.25, chunk=2,
                                 records=PairScores(records, "fever", identity))
    shard = records / "fever.000.jsonl.gz"
    with shard.open("ab") as fh:  # a kill in the middle of the next chunk's gzip member
        fh.write(b"\x1f\x8b\x08\x00garbage")
    # another machine: no local cache, only the records
    done = Counting.calls
    again = cache_teacher_scores(rows, Counting(), tmp_path / "b" / "t.jsonl", 0.25,
                                 records=PairScores(records, "fever", identity))
    assert Counting.calls - done == sum(len(r["pos"]) + len(r["neg"]) for r in rows[3:])  # only the missing pairs
    np.testing.assert_allclose([d[2] for r in again[:3] for d in r["pos"] + r["neg"]],
                               [d[2] for r in first for d in r["pos"] + r["neg"]], atol=1e-6)
    done = Counting.calls
    cache_teacher_scores(rows, Counting(), tmp_path / "c" / "t.jsonl", 0.25,
                         records=PairScores(records, "fever", identity))
    assert Counting.calls == done  # everything recorded now
    recorded = _record_rows(records)
    assert len(recorded) == sum(len(r["pos"]) + len(r["neg"]) for r in rows)
    assert set(recorded[0]) == {"query_id", "passage_id", "score"}
    assert not [p for f in records.glob("*.gz") for p in file_problems(f, f.name)]  # the hygiene scan of a clone
    texts = [t for q, t in TOPICS] + [q for q, t in TOPICS]
    assert not any(t in shard_text for shard_text in [json.dumps(recorded)] for t in texts)

    # another teacher (other weights): its records are ignored, in one line, and not extended
    other = {**identity, "weights_sha256": {"model.safetensors": "0" * 64}}
    size = shard.stat().st_size
    with caplog.at_level("WARNING"):
        ignored = PairScores(records, "fever", other)
    assert not ignored.scores and "another scorer" in caplog.text and len(caplog.records) == 1
    done = Counting.calls
    cache_teacher_scores(rows[:1], Counting(), tmp_path / "d" / "t.jsonl", 0.25, records=ignored)
    assert Counting.calls - done == len(rows[0]["pos"]) + len(rows[0]["neg"]) and shard.stat().st_size == size


def test_records_shard_below_the_size_limit(tmp_path):
    from ragsieve.data.score_records import PairScores, read_id_records, write_id_records

    records = PairScores(tmp_path / "s", "nq", {"scorer": "x"}, max_bytes=300)
    for k in range(10):
        records.add([(f"q{k}", f"p{j}", 0.5 * j) for j in range(20)])
    shards = sorted((tmp_path / "s").glob("nq.*.jsonl.gz"))
    assert len(shards) > 1 and all(s.stat().st_size < 300 + 400 for s in shards)
    assert len(PairScores(tmp_path / "s", "nq", {"scorer": "x"}).scores) == 200
    rows = [{"query_id": f"q{k}", "pos_ids": [f"p{k}"]} for k in range(50)]
    assert len(write_id_records(tmp_path / "m", "nq", rows, max_bytes=200)) > 1
    assert read_id_records(tmp_path / "m", "nq") == rows and read_id_records(tmp_path / "m", "fever") is None


@requires_data
def test_mined_rows_round_trip_through_id_records(tmp_path):
    """Mined rows are committed as ids (no text) and rebuilt from the data, without MiniLM."""
    from ragsieve.benchmarks.mining import MiningConfig, mined_ids, mined_rows_from_ids, split_for_mining
    from ragsieve.errors import RagsieveError
    from tests.test_repo_hygiene import text_problems

    config = MiningConfig(train_questions=6, dev_questions=2)
    ds, train, dev = split_for_mining("fever", config)
    pool = [p for p in ds.passages if p.text.strip()][:40]
    rows = []
    for split, questions in (("train", train), ("dev", dev)):
        for k, q in enumerate(questions):
            golds = [g for g in q.gold_passage_ids if g in ds.passage_by_id()][:2]
            negs = [p for p in pool[3 * k: 3 * k + 3] if p.id not in golds]
            rows.append({"dataset": ds.name, "split": split, "qid": q.id, "query": q.text,
                         "pos": [[g, ds.passage_by_id()[g].full_text, 0.5] for g in golds],
                         "neg": [[p.id, p.full_text, 0.125 * j, "bm25"] for j, p in enumerate(negs)]})
    ids = [mined_ids(r) for r in rows]
    assert not [p for i, r in enumerate(ids) for p in text_problems(r, f"row {i}")]
    assert mined_rows_from_ids("fever", config, ids) == rows
    with pytest.raises(RagsieveError, match="not in the data"):
        mined_rows_from_ids("fever", config, [{**ids[0], "neg_ids": ["no-such-passage"]}])


def test_truncated_student_keeps_the_first_layers_and_the_head(tmp_path, teacher_dir):
    import torch
    from transformers import AutoModelForSequenceClassification

    from ragsieve.errors import RagsieveError
    from ragsieve.rerank.training.distill import truncated_student

    folder = truncated_student(teacher_dir, 1, tmp_path / "student", max_length=64)
    student = AutoModelForSequenceClassification.from_pretrained(folder)
    teacher = AutoModelForSequenceClassification.from_pretrained(teacher_dir)
    assert student.config.num_hidden_layers == 1 and len(student.bert.encoder.layer) == 1
    assert torch.equal(student.classifier.weight, teacher.classifier.weight)
    first = [m.bert.encoder.layer[0].output.dense.weight for m in (student, teacher)]
    assert torch.equal(*first)
    with pytest.raises(RagsieveError, match="1..2"):
        truncated_student(teacher_dir, 3, tmp_path / "too-deep")
    # a fresh head: the same first layer under a newly initialised pooler and classifier
    fresh = AutoModelForSequenceClassification.from_pretrained(
        truncated_student(teacher_dir, 1, tmp_path / "fresh", max_length=64, fresh_head=True))
    first = [m.bert.encoder.layer[0].output.dense.weight for m in (fresh, teacher)]
    assert torch.equal(*first)
    assert not torch.equal(fresh.classifier.weight, teacher.classifier.weight)
    assert not torch.equal(fresh.bert.pooler.dense.weight, teacher.bert.pooler.dense.weight)
    assert float(fresh.classifier.bias.abs().max()) == 0.0


def test_embedded_fast_is_the_default_behind_a_cascade_until_a_student_ships():
    from ragsieve.registry import load_reranker
    from ragsieve.rerank.cascade import FAST_TOP, CascadeRanker

    fast = load_reranker("embedded:fast", whole_passages=False)
    assert isinstance(fast, CascadeRanker) and fast.top == FAST_TOP
    with pytest.raises(ModelNotAvailable, match="known: base, fast"):
        load_reranker("embedded:nope")


def test_distill_study_trains_evaluates_and_ships_a_student(tmp_path, teacher_dir):
    from ragsieve.rerank.shipped import load_shipped_reranker
    from studies.runner import run_experiment_file

    from ragsieve.benchmarks.mining import held_out_sources
    from ragsieve.benchmarks.relevance import split_questions
    from ragsieve.data import load_dataset

    # the dev rows stand for real FEVER questions outside the held-out set: their candidate lists choose the checkpoint
    train_questions, _ = split_questions(load_dataset("fever"), held_out_sources()["fever"])
    rows = [{**r, "qid": q.id} if r["split"] == "dev" else r for r, q in zip(_mined_rows(), train_questions)]
    mined = tmp_path / "mined"
    mined.mkdir()
    (mined / "fever.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "study"
    cfg = tmp_path / "distill.yaml"
    cfg.write_text(
        f"experiment: rerank_distill\nout_dir: {out}\nparams:\n  mined_dir: {mined}\n  teacher: {teacher_dir}\n"
        "  students: [{name: fast, layers: 1, tolerance: 0.02}, {name: base, layers: 2, tolerance: 1.0},"
        " {name: base, layers: 1, tolerance: 1.0}, {name: fast, layers: 2, tolerance: 0.02, skip: tried before}]\n"
        "  distill: {group_size: 3, batch_size: 2, max_steps: 2, eval_steps: 1, max_length: 64, dev_docs: 4,"
        " teacher_scale: 1.0}\n"
        f"  datasets: [fever]\n  eval_queries: 3\n  bootstrap: 100\n  asset_root: {tmp_path / 'assets'}\n"
        f"  records: {tmp_path / 'records'}\n")
    result = run_experiment_file(cfg)
    # per name, fewest layers first: a tolerance of 1.0 lets base-1l take the name, so base-2l never trains
    assert result["students"]["base-1l"]["shipped"] and (tmp_path / "assets" / "base-reranker").is_dir()
    assert result["students"]["base-2l"] == {"name": "base", "layers": 2, "tolerance": 1.0, "shipped": False,
                                             "trained": False, "why": "not trained: base-1l took embedded:base"}
    assert not (out / "work" / "students" / "base-2l").exists()
    assert result["students"]["fast-2l"]["why"] == "tried before" and not result["students"]["fast-2l"]["trained"]
    assert not (out / "work" / "students" / "fast-2l").exists()  # a tried candidate stays listed, untrained
    rows = result["evaluation"]["by_dataset"]["fever"]
    assert set(rows) == {"teacher", "cosine", "teacher-cross-encoder", "fast-1l", "fast-1l-onnx-int8", "base-1l",
                         "base-1l-onnx-int8"}
    assert rows["fast-1l"]["n"] == 3
    assert {"diff", "low", "high"} <= set(rows["fast-1l"]["vs_teacher"]) and "vs_cosine" in rows["teacher"]
    assert 0.0 <= rows["teacher"]["ece"]["mean"] <= 1.0 and 0.0 <= rows["fast-1l"]["ece"]["mean"] <= 1.0
    verdict = result["students"]["fast-1l"]
    assert verdict["layers"] == 1 and isinstance(verdict["ship"], bool) and verdict["why"]
    assert verdict["backend"] in ("torch", "onnx-int8") and verdict["int8_max_ndcg10_loss"] is not None
    work = out / "work"
    assert (work / "teacher-scores" / "fever.jsonl").is_file() and (work / "students" / "fast-1l" / "final").is_dir()
    # the checkpoint is chosen on the dev questions' candidate lists, the mined dev groups logged beside them
    state = json.loads(max((work / "students" / "fast-1l" / "checkpoints").glob("checkpoint-*/trainer_state.json"),
                           key=lambda p: int(p.parent.name.split("-")[1])).read_text())
    evals = [e for e in state["log_history"] if "eval_devlists_ndcg@10" in e]
    assert evals and all("eval_dev_ndcg@10" in e for e in evals)
    assert state["best_metric"] in [e["eval_devlists_ndcg@10"] for e in evals]

    # the ship step on its own (a 2-step student rarely meets a target): dev labels its own top passage
    from ragsieve.rerank.neural import CrossEncoderRanker
    from studies.rerank_distill import RerankDistillStudy

    study, config = RerankDistillStudy(), RerankDistillStudy.Config(**{
        "teacher": str(teacher_dir), "students": [{"name": "fast", "layers": 1, "tolerance": 0.02}],
        "distill": {"max_length": 64}, "asset_root": str(tmp_path / "assets")})
    final = work / "students" / "fast-1l" / "final"
    student = CrossEncoderRanker(str(final), max_length=64)
    dev = []
    for row in _mined_rows():
        docs = row["pos"] + row["neg"]
        s = student.predict_logits([(row["query"], d[1]) for d in docs])
        top = int(np.argmax(s))
        dev.append({**row, "pos": [docs[top]], "neg": [d for k, d in enumerate(docs) if k != top]})
    folder = study.ship(config, config.students[0], final, teacher_dir, dev, work, result)
    shipped = load_shipped_reranker(folder)
    card = json.loads((folder / "ragsieve_reranker.json").read_text())
    assert card["calibration"]["temperature"] > 0 and "cosine_weight" not in card  # one forward, no MiniLM
    assert card["default_backend"] == verdict["backend"] and (folder / "model.int8.onnx").is_file()
    p = shipped.predict_proba("who wrote hamlet", [TOPICS[0][1], TOPICS[1][1]])
    assert ((0 <= p) & (p <= 1)).all()
    again = run_experiment_file(cfg)  # everything cached: nothing trains or scores again
    assert again["evaluation"]["by_dataset"] == result["evaluation"]["by_dataset"]
    reported = run_experiment_file(cfg, report_only=True)  # the tables from the cache alone
    verdicts = result["evaluation"]["verdicts"]
    assert reported["evaluation"]["verdicts"] == {k: verdicts[k] for k in ("fast-1l", "base-1l")}
    tables = (out / "TABLES.md").read_text()
    assert "## `fast-1l` (1 layer)" in tables and "| fever | 3 |" in tables and "cross-encoder alone" in tables

    # another machine: the work folder's scores are gone, the committed records are not
    records = tmp_path / "records"
    kinds = {"mined", "teacher", "eval-teacher", "eval-cosine"}
    assert {d.name for d in records.iterdir()} == kinds
    assert all((records / k / "meta.json").is_file() and any((records / k).glob("fever.*.jsonl.gz")) for k in kinds)
    before = {f: f.read_bytes() for f in records.rglob("*.gz")}
    shutil.rmtree(work / "teacher-scores")
    shutil.rmtree(work / "eval")
    third = run_experiment_file(cfg)
    assert {f: f.read_bytes() for f in records.rglob("*.gz")} == before  # nothing scored again
    for ranker in ("teacher", "cosine", "teacher-cross-encoder"):  # the last from the records: mix − cosine term
        assert third["evaluation"]["by_dataset"]["fever"][ranker]["nDCG@10"] == rows[ranker]["nDCG@10"]


def test_calibration_pairs_use_the_dev_questions_candidate_lists():
    """A mined dev question of a held-out dataset is calibrated on its retrieved candidates (the held-out kind of
    list); rows of other pools, or questions without such a list, keep their mined group."""
    from ragsieve.benchmarks.mining import held_out_sources
    from ragsieve.benchmarks.relevance import ranking_queries
    from ragsieve.data import load_dataset
    from studies.rerank_distill import RerankDistillConfig, calibration_pairs

    ds = load_dataset("fever")
    real = ranking_queries(ds, [q for q in ds.questions if q.gold_passage_ids][:5], held_out_sources()["fever"])[0]
    rows = _mined_rows()[6:]  # two hand-made dev rows (no such question in FEVER)
    rows.append({**rows[0], "qid": real.query_id, "query": real.query})
    qs, ps, ys = calibration_pairs(RerankDistillConfig(), rows)
    assert qs.count(real.query) == len(real.candidates)  # the candidate list, not the mined group
    assert sum(y for q, y in zip(qs, ys) if q == real.query) == len(real.relevant & {p.id for p in real.candidates})
    assert qs.count(rows[0]["query"]) == 6 and qs.count(rows[1]["query"]) == 6  # 1 gold + 5 negatives each
    groups = calibration_pairs(RerankDistillConfig(calibration="dev-groups"), rows)
    assert len(groups[0]) == 18


def test_checkpoints_are_chosen_only_on_lists_that_can_tell_rankers_apart():
    """A one-passage list (sklearn's nDCG refuses it, which ended a real run at its first evaluation), or a list
    with no relevant or no irrelevant passage, scores every order alike: training leaves it out of the choice."""
    from ragsieve.rerank.training.distill import can_tell_rankers_apart

    def telling_list(documents, positive):
        return can_tell_rankers_apart({"query": "q", "positive": positive, "documents": documents})

    assert telling_list(["gold", "other"], ["gold"])
    assert not telling_list(["gold"], ["gold"])
    assert not telling_list(["a", "b"], [])
    assert not telling_list(["a", "b"], ["a", "b"])


def test_the_teachers_cross_encoder_alone_is_its_mix_minus_the_cosine_term(teacher_dir):
    from ragsieve.benchmarks.forgetting import heldout_queries
    from ragsieve.rerank.neural import CrossEncoderRanker
    from studies.rerank_distill import RerankDistillStudy
    from studies.rerank_distill_common import CROSS_ALONE

    queries = heldout_queries("fever", max_queries=2)
    refs = RerankDistillStudy.references(RerankDistillStudy.Config(teacher=str(teacher_dir)), teacher_dir, queries)
    cross = CrossEncoderRanker(str(teacher_dir), max_length=64)
    for q in queries:
        passages = list(q.candidates)
        np.testing.assert_allclose(refs[CROSS_ALONE].score(q.query, passages),
                                   cross.predict_logits([(q.query, p.full_text) for p in passages]), atol=1e-4)


def test_the_teachers_window_and_best_chunk_rows_read_more_of_a_long_candidate(teacher_dir):
    """teacher@window<N> is the teacher with its cross-encoder reading N tokens per pair; teacher@best-chunk reads a
    longer candidate as serve does, by its best window-sized chunk; on candidates within the window both are the
    teacher's scores."""
    from ragsieve.benchmarks.forgetting import heldout_queries
    from studies.rerank_distill import RerankDistillStudy
    from studies.rerank_distill_backends import BEST_CHUNK, window_key

    queries = heldout_queries("fever", max_queries=2)
    cfg = RerankDistillStudy.Config(teacher=str(teacher_dir), teacher_windows=[128], teacher_best_chunk=True)
    refs = RerankDistillStudy.references(cfg, teacher_dir, queries)
    assert refs[window_key(128)].inner.cross.window()[1] == 128 and refs[BEST_CHUNK].inner.ranker.window()[1] == 64
    q = queries[0]
    short = [p for p in q.candidates if len(p.full_text) < 100]  # within the 64-token window: nothing to chunk
    assert short
    long_text = " ".join(p.full_text for p in q.candidates)  # well past it
    for key in (window_key(128), BEST_CHUNK):
        np.testing.assert_allclose(refs[key].score(q.query, short), refs["teacher"].score(q.query, short), atol=0.3)
    from ragsieve.data.records import Passage

    from ragsieve.rerank.shipped import load_shipped_reranker

    chunked = refs[BEST_CHUNK].score(q.query, [Passage("long", long_text)])
    truncated = load_shipped_reranker(teacher_dir).score(q.query, [Passage("long", long_text)])
    assert chunked[0] >= truncated[0] - 1e-4  # the best chunk scores at least as the first window alone


def test_a_student_with_its_own_alpha_or_loss_trains_under_its_own_key():
    from studies.rerank_distill import RerankDistillConfig, StudentConfig

    kl_heavy = StudentConfig(name="base", layers=6, tolerance=0.005, alpha=8.0, time_budget_minutes=150)
    assert kl_heavy.key == "base-6l-a8" and StudentConfig(name="base", layers=6, tolerance=0.005).key == "base-6l"
    distill = RerankDistillConfig().distill.model_copy(update=kl_heavy.distill_overrides())
    assert (distill.alpha, distill.time_budget_minutes) == (8.0, 150)
    assert StudentConfig(name="fast", layers=1, tolerance=0.02).distill_overrides() == {}
    margins = StudentConfig(name="base", layers=6, tolerance=0.005, alpha=8.0, distill_loss="margin-mse")
    assert margins.key == "base-6l-a8-mmse" and margins.distill_overrides()["distill_loss"] == "margin-mse"
    fresh = StudentConfig(name="fast", layers=1, tolerance=0.02, fresh_head=True, lr=2e-4)
    assert fresh.key == "fast-1l-fh-lr0.0002" and fresh.distill_overrides() == {"lr": 2e-4}
    keys = [st.key for st in RerankDistillConfig().students]
    assert len(keys) == len(set(keys))  # every candidate trains and is evaluated under its own key
    with pytest.raises(ValueError, match="share the key base-6l"):
        RerankDistillConfig(students=[{"name": "base", "layers": 6, "tolerance": 0.005}] * 2)


def test_the_teacher_on_faster_backends_is_evaluated_and_written_into_its_card(tmp_path, teacher_dir):
    """A teacher variant's row is the teacher's own cross-encoder logit plus the int8 cosine term; the fastest
    variant within tolerance is written into the shipped card only when the shipped weights are the teacher's."""
    from ragsieve.benchmarks.forgetting import heldout_queries
    from ragsieve.rerank.mixed import CosineMixRanker
    from ragsieve.rerank.shipped import load_shipped_reranker
    from studies.rerank_distill import RerankDistillStudy
    from studies.rerank_distill_backends import backend_verdict, variant_key, write_backends

    queries = heldout_queries("fever", max_queries=2)
    cfg = RerankDistillStudy.Config(teacher=str(teacher_dir), teacher_backends=["torch+onnx-int8"])
    refs = RerankDistillStudy.references(cfg, teacher_dir, queries)
    key = variant_key("torch+onnx-int8")
    for q in queries:
        passages = list(q.candidates)
        # MiniLM on int8 moves a cosine by ≈ 0.02 at most: times 0.25 · 20 on the logit scale
        np.testing.assert_allclose(refs[key].score(q.query, passages), refs["teacher"].score(q.query, passages),
                                   atol=5 * 0.05)
    assert refs[key].calibration is not None  # the teacher's: same logit scale

    def rows(diff, low, high, cos_high=0.1):
        return {"teacher": {}, key: {"n": 200, "vs_teacher": {"diff": diff, "low": low, "high": high},
                                     "vs_cosine": {"diff": 0.0, "low": -0.1, "high": cos_high}}}

    assert backend_verdict({"a": rows(-0.001, -0.004, 0.002)}, "torch+onnx-int8", 0.005)["ship"]
    # a backend swap must show it keeps the scores: within the tolerance at the point estimate is not enough
    unshown = backend_verdict({"a": rows(-0.001, -0.004, 0.002), "b": rows(0.0, -0.01, 0.01)}, "torch+onnx-int8",
                              0.005)
    assert not unshown["ship"] and unshown["per_set"] == {"a": "met", "b": "met at the point estimate, not shown"}
    assert unshown["why"] == "not shown within 0.005 of the teacher on b +0.000 [-0.010, +0.010]"
    assert not backend_verdict({"a": rows(-0.006, -0.01, -0.002)}, "torch+onnx-int8", 0.005)["ship"]
    below_cosine = backend_verdict({"a": rows(0.0, -0.001, 0.001, cos_high=-0.01)}, "torch+onnx-int8", 0.005)
    assert not below_cosine["ship"] and "below cosine" in below_cosine["why"]

    asset = tmp_path / "assets" / "base-reranker"
    shutil.copytree(teacher_dir, asset)
    write_backends(asset, "torch+onnx-int8", {"a": rows(-0.001, -0.004, 0.002)}, 0.005)
    card = json.loads((asset / "ragsieve_reranker.json").read_text())
    assert card["default_backend"] == "torch" and card["cosine_backend"] == "onnx-int8"
    assert card["backend_choice"]["heldout_ndcg10_vs_fp32"]["a"] == {"diff": -0.001, "low": -0.004, "high": 0.002}
    ranker = load_shipped_reranker(asset)
    assert isinstance(ranker, CosineMixRanker) and ranker.cosine.backend == "onnx-int8"
    q = queries[0]
    np.testing.assert_allclose(ranker.score(q.query, list(q.candidates)),
                               refs["teacher"].score(q.query, list(q.candidates)), atol=5 * 0.05)
    assert load_shipped_reranker(asset, cosine_backend="torch").cosine.backend == "torch"
    # a bf16 choice carries what a CPU without bf16 units loads instead; a later plain choice drops it
    by = {"a": {**rows(-0.001, -0.004, 0.002), variant_key("torch-bf16+torch-bf16"): rows(0, -0.001, 0.001)[key]}}
    write_backends(asset, "torch-bf16+torch-bf16", by, 0.005, "torch+onnx-int8")
    card = json.loads((asset / "ragsieve_reranker.json").read_text())
    assert card["default_backend"] == card["cosine_backend"] == "torch-bf16"
    assert card["without_bf16"] == {"default_backend": "torch", "cosine_backend": "onnx-int8"}
    write_backends(asset, "torch+onnx-int8", by, 0.005)
    assert "without_bf16" not in json.loads((asset / "ragsieve_reranker.json").read_text())


def test_calibration_transfer_shows_what_one_map_cannot_do_and_own_labels_can():
    """Two sets where the same score means different odds of relevance: one calibration is off on at least one
    set even when fitted to both (the oracle rows), while a refit on a set's own queries is calibrated there."""
    from ragsieve.rerank.calibration import Calibration
    from studies.rerank_distill import distill_tables
    from studies.rerank_distill_calibration import calibration_transfer

    rng = np.random.default_rng(0)

    def one_set(shift: float, queries: int = 120):
        x = rng.normal(0.0, 2.0, size=queries * 10)
        y = (rng.random(len(x)) < 1 / (1 + np.exp(-(x + shift)))).astype(int)
        return x, y, np.repeat([f"q{i}" for i in range(queries)], 10)

    sets = {"lenient": one_set(+2.0), "strict": one_set(-2.0)}
    out = calibration_transfer(sets, Calibration(), draws=5)
    assert set(out) == {"shipped", "one_platt_oracle", "one_isotonic_oracle", "leave_one_set_out",
                        "refit_on_own_queries", "refit_on_own_queries_platt_targets"}
    assert min(out["leave_one_set_out"].values()) > 0.1  # fitted on the other set: off the other way
    assert max(out["one_platt_oracle"]["by_set"].values()) > 0.1  # no single map fits both
    assert max(out["one_isotonic_oracle"].values()) > 0.1
    for key in ("refit_on_own_queries", "refit_on_own_queries_platt_targets"):  # plain, and as the CLI fits
        for name, refit in out[key].items():
            assert refit["fit_queries"] == 40 and refit["draws"] == 5 and refit["median"] < 0.06, (key, name)
    table = distill_tables({}, [], {}, out)
    assert "| strict |" in table and "oracle" in table and "ragsieve rerank calibrate" in table


def test_teacher_lists_train_on_the_lists_the_verdict_reranks(tmp_path, teacher_dir):
    """Train questions of a set with held-out lists become rows over their own candidate lists, the teacher's
    top candidate as the positive, scored once and recorded; a set without such lists keeps its mined groups."""
    from rich.console import Console

    from ragsieve.benchmarks.mining import held_out_sources
    from ragsieve.benchmarks.relevance import split_questions
    from ragsieve.data import load_dataset
    from studies.rerank_distill import RerankDistillStudy

    train_questions, _ = split_questions(load_dataset("fever"), held_out_sources()["fever"])
    rows = [{**r, "qid": q.id} for r, q in zip(_mined_rows()[:3], train_questions)]
    pool = [{**r, "dataset": "hotpotqa-distractor-1517"} for r in _mined_rows()[3:5]]
    cfg = RerankDistillStudy.Config(teacher=str(teacher_dir), records=str(tmp_path / "records"))
    study = RerankDistillStudy()
    out = study.teacher_lists(cfg, rows + pool, teacher_dir, tmp_path, Console(quiet=True), per_dataset=2)
    lists = [r for r in out if r["dataset"] == "fever"]
    assert [r["qid"] for r in lists] == [q.id for q in train_questions[:2]]
    assert [r for r in out if r["dataset"] != "fever"] == pool
    for r in lists:
        scores = [d[2] for d in r["pos"] + r["neg"]]
        assert scores[0] == max(scores) and len(scores) > 2  # the teacher's top first, then the rest of the list
    assert list((tmp_path / "records" / "teacher-lists").glob("fever.*.jsonl.gz"))
    again = study.teacher_lists(cfg, rows + pool, teacher_dir, tmp_path, Console(quiet=True), per_dataset=2)
    assert again == out  # read back from the records
