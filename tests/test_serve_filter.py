"""``/v1/filter`` on a real loopback server: scores and threshold on ``/v1/rerank``'s [0, 1] scale,
``raw_scores: true`` on the grader's raw scale, the same documents kept for t and its raw value."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import numpy as np
import pytest
from scipy.special import expit, logit

from ragsieve.serve import ServeConfig, create_app
from ragsieve.serve.runner import BackgroundServer

from tests.test_serve import DOCS, QUERY  # the serve suite's documents and query
README = Path(__file__).resolve().parents[1] / "README.md"


def offline_order(query=QUERY, docs=DOCS) -> list[int]:
    from ragsieve.registry import load_reranker

    return [r.index for r in load_reranker("bm25").rank(query, docs).results]


def kept(server, **body) -> dict:
    r = httpx.post(f"{server.url}/v1/filter", json={"query": QUERY, "documents": DOCS, **body})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def bm25_server():
    """No grader: the uncalibrated bm25 ranker grades itself (its [0, 1] score is the logistic of BM25)."""
    with BackgroundServer(create_app(ServeConfig(reranker="bm25", top_k=4))) as server:
        yield server


@pytest.fixture(scope="module")
def graded_server():
    """A calibrated bm25 ranker and a bm25 grader with another calibration and a raw threshold of 0.1,
    so a ranker/grader mix-up or a raw/[0, 1] mix-up shows."""
    from ragsieve.registry import new_grader
    from ragsieve.rerank.calibration import Calibration
    from ragsieve.rerank.lexical import BM25Ranker
    from ragsieve.serve.batcher import PairBatcher
    from ragsieve.serve.models import ServedModels

    ranker = BM25Ranker()
    ranker.calibration = Calibration(temperature=0.2, bias=-1.5)
    grader = new_grader("ranker", base="bm25", threshold=0.1)
    grader.calibration = Calibration(temperature=0.5, bias=0.3)
    config = ServeConfig(reranker="bm25", grader="bm25-grader", top_k=4)
    served = ServedModels(ranker, PairBatcher(ranker, name="ranker"), grader, PairBatcher(grader, name="grader"),
                          grader_name="bm25-grader")
    with BackgroundServer(create_app(config, served)) as server:
        server.ranker, server.grader = ranker, grader
        yield server


def test_scores_and_threshold_are_in_unit_range_and_match_rerank(graded_server):
    from ragsieve.rerank.base import as_passages

    ranker, grader = graded_server.ranker, graded_server.grader
    data = kept(graded_server, return_documents=True)
    grade_raw = grader.score_pairs([QUERY] * len(DOCS), DOCS)
    expected = [i for i in offline_order() if grade_raw[i] >= 0.1]
    assert [x["index"] for x in data["results"]] == expected and data["dropped"] == len(DOCS) - len(expected)
    assert 0 < len(expected) < len(DOCS)  # the grader acted
    # the grader's raw threshold of 0.1 is answered as its [0, 1] value
    assert data["threshold"] == pytest.approx(grader.unit_scores([0.1])[0]) and data["raw_scores"] is False
    assert 0.0 < data["threshold"] < 1.0
    rerank = httpx.post(f"{graded_server.url}/v1/rerank", json={"query": QUERY, "documents": DOCS}).json()
    relevance = {x["index"]: x["relevance_score"] for x in rerank["results"]}
    unit_grade = grader.unit_scores(grade_raw)
    for x in data["results"]:
        assert x["relevant"] and 0.0 <= x["relevance_score"] <= 1.0 and 0.0 <= x["grade_score"] <= 1.0
        assert x["relevance_score"] == pytest.approx(relevance[x["index"]], abs=1e-9)  # /v1/rerank's value
        assert x["grade_score"] == pytest.approx(unit_grade[x["index"]], abs=1e-9)
        assert x["grade_score"] >= data["threshold"] and x["document"]["text"] == DOCS[x["index"]]
    # raw_scores: the ranker's and the grader's own scores, the grader's raw threshold
    raw = kept(graded_server, raw_scores=True)
    rank_raw = ranker.score(QUERY, as_passages(DOCS))
    assert [x["index"] for x in raw["results"]] == expected and raw["threshold"] == 0.1 and raw["raw_scores"]
    assert [x["relevance_score"] for x in raw["results"]] == pytest.approx([rank_raw[i] for i in expected])
    assert [x["grade_score"] for x in raw["results"]] == pytest.approx([grade_raw[i] for i in expected])
    assert not np.allclose(rank_raw[expected], [x["relevance_score"] for x in data["results"]])


@pytest.mark.parametrize("server_name", ["bm25_server", "graded_server"])
def test_a_threshold_keeps_the_same_documents_in_unit_and_raw_scale(server_name, request):
    """t on the [0, 1] scale keeps what its raw value keeps with raw_scores (for uncalibrated bm25, logit(t))."""
    server = request.getfixturevalue(server_name)
    thresholder = server.grader if server_name == "graded_server" else None
    kept_sets = set()
    for t in (0.05, 0.3, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9, 0.99):
        unit = kept(server, threshold=t)
        raw_t = thresholder.raw_threshold(t) if thresholder is not None else float(logit(t))
        raw = kept(server, threshold=raw_t, raw_scores=True)
        assert [x["index"] for x in unit["results"]] == [x["index"] for x in raw["results"]], t
        assert unit["threshold"] == t and raw["threshold"] == pytest.approx(raw_t)
        assert all(x["grade_score"] >= t for x in unit["results"])
        if thresholder is None:  # the ranker grades itself: its [0, 1] score is the logistic of BM25
            assert [x["grade_score"] for x in unit["results"]] == pytest.approx(
                [expit(x["grade_score"]) for x in raw["results"]])
        kept_sets.add(tuple(x["index"] for x in unit["results"]))
    assert len(kept_sets) >= 3  # the thresholds really cut at different places
    assert len(kept(server, threshold=0.0)["results"]) == len(DOCS)
    assert kept(server, threshold=1.0)["results"] == []


@pytest.mark.parametrize(
    "body",
    [
        {"threshold": 1.5},
        {"threshold": -0.1},
        {"threshold": 5.0, "raw_scores": False},
        {"threshold": "high"},
    ],
)
def test_a_threshold_outside_unit_range_is_a_one_line_422(bm25_server, body):
    r = httpx.post(f"{bm25_server.url}/v1/filter", json={"query": QUERY, "documents": DOCS, **body})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error.startswith("threshold:") and "\n" not in error


def test_non_finite_thresholds_are_refused_even_raw(bm25_server):
    for threshold, raw_scores in (("NaN", "false"), ("Infinity", "true"), ("-Infinity", "true")):
        body = f'{{"query": "q", "documents": ["a"], "threshold": {threshold}, "raw_scores": {raw_scores}}}'
        r = httpx.post(f"{bm25_server.url}/v1/filter", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and r.json()["error"].startswith("threshold:"), r.text
    # on the raw scale any finite value is a threshold
    assert kept(bm25_server, threshold=-3.0, raw_scores=True)["dropped"] == 0


def test_without_a_grader_a_threshold_is_needed(bm25_server):
    r = httpx.post(f"{bm25_server.url}/v1/filter", json={"query": QUERY, "documents": DOCS})
    assert r.status_code == 400 and "no grader configured" in r.json()["error"]
    data = kept(bm25_server, threshold=0.6, top_n=3)
    assert [x["index"] for x in data["results"]] == offline_order()[:2] and data["dropped"] == 2


def test_a_saved_grader_keeps_relevant_documents(tmp_path):
    from ragsieve.registry import new_grader

    new_grader("ranker", base="bm25", threshold=0.1).save(tmp_path / "grader")
    with BackgroundServer(create_app(ServeConfig(reranker="bm25", grader=str(tmp_path / "grader")))) as server:
        data = kept(server, return_documents=True)
        assert [x["index"] for x in data["results"]] == offline_order()[:2] and data["dropped"] == 2
        # an uncalibrated bm25 grader: its [0, 1] scale is the logistic of the raw score
        assert data["threshold"] == pytest.approx(expit(0.1))
        assert all(x["relevant"] and x["grade_score"] >= expit(0.1) for x in data["results"])
        assert kept(server, raw_scores=True)["threshold"] == 0.1
        assert data["results"][0]["document"]["text"] == DOCS[offline_order()[0]]
        models = httpx.get(f"{server.url}/v1/models").json()["data"]
        assert [m["kind"] for m in models] == ["reranker", "grader"]


def test_the_readme_filter_example(bm25_server):
    """The README's /v1/filter curl body is valid and keeps what its comment says (bm25 stands in for
    embedded:base: the example's documents are as easy for both)."""
    text = README.read_text(encoding="utf-8")
    example = r"curl -s localhost:8080/v1/filter .*?\\\n\s*-d '([^']+)'\n# keeps document (\d+).*\"dropped\": (\d+)"
    match = re.search(example, text)
    assert match, "README has no /v1/filter curl example with its outcome"
    body, index, dropped = json.loads(match.group(1)), int(match.group(2)), int(match.group(3))
    assert 0.0 <= body["threshold"] <= 1.0 and "raw_scores" not in body
    r = httpx.post(f"{bm25_server.url}/v1/filter", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert [x["index"] for x in data["results"]] == [index] and data["dropped"] == dropped
    assert data["threshold"] == body["threshold"] and 0.0 <= data["results"][0]["relevance_score"] <= 1.0


def test_openapi_documents_the_scale(bm25_server):
    schemas = httpx.get(f"{bm25_server.url}/openapi.json").json()["components"]["schemas"]
    request, kept_doc = schemas["FilterRequest"]["properties"], schemas["FilteredDocument"]["properties"]
    assert "[0, 1]" in request["threshold"]["description"] and "raw" in request["raw_scores"]["description"]
    assert "[0, 1]" in kept_doc["grade_score"]["description"] and "[0, 1]" in kept_doc["relevance_score"]["description"]
    assert "[0, 1]" in schemas["FilterResponse"]["properties"]["threshold"]["description"]


def test_a_request_a_reload_overtakes_ranks_and_grades_with_the_models_it_started_with(tmp_path):
    """/v1/filter holds one snapshot of the served models: a reload while the request waits in the
    ranker's batch serves a re-saved grader to later requests, and this request still ranks AND grades
    with the pair it started with (before, the grader it read was closed under it: a 503)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from ragsieve.registry import new_grader

    grader_dir = tmp_path / "grader"
    new_grader("ranker", base="bm25", threshold=0.1).save(grader_dir)
    # a batch waits 1 s for company: time for a reload to overtake a request inside it
    app = create_app(ServeConfig(reranker="bm25", grader=str(grader_dir), max_wait_ms=1000))
    body = {"query": QUERY, "documents": DOCS, "raw_scores": True}
    with BackgroundServer(app) as server, ThreadPoolExecutor(1) as pool:
        before = kept(server, raw_scores=True)
        assert before["threshold"] == 0.1
        old_models = app.state.serve.models
        inflight = pool.submit(httpx.post, f"{server.url}/v1/filter", json=body, timeout=120)
        deadline = time.monotonic() + 60
        while old_models.users == 0 and time.monotonic() < deadline:  # until the request holds the models
            time.sleep(0.01)
        assert old_models.users == 1
        new_grader("ranker", base="bm25", threshold=5.0).save(grader_dir)
        reloaded = httpx.post(f"{server.url}/admin/reload", timeout=120)
        assert reloaded.status_code == 200, reloaded.text
        overtaken = inflight.result()
        assert overtaken.status_code == 200, overtaken.text
        # the old grader's threshold and cut, the old ranker's scores: nothing of the new models
        assert overtaken.json()["threshold"] == 0.1
        assert [(x["index"], x["relevance_score"], x["grade_score"]) for x in overtaken.json()["results"]] == [
            (x["index"], x["relevance_score"], x["grade_score"]) for x in before["results"]]
        assert old_models.users == 0 and app.state.serve.models is not old_models
        after = kept(server, raw_scores=True)
        assert after["threshold"] == 5.0 and after["results"] == []  # the new grader, for the next request
