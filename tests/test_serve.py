"""``ragsieve serve``: a real uvicorn on loopback, driven by real clients (cohere SDK, httpx, schemathesis)."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from ragsieve.rerank.base import as_passages
from ragsieve.serve import ServeConfig, create_app
from ragsieve.serve.runner import BackgroundServer

DOCS = [
    "Paris is the capital and largest city of France.",
    "Hamlet is a tragedy written by William Shakespeare around 1600.",
    "The quick brown fox jumps over the lazy dog.",
    "Shakespeare's Hamlet tells of Prince Hamlet of Denmark.",
]
QUERY = "who wrote hamlet shakespeare"


def offline_order(query=QUERY, docs=DOCS) -> list[int]:
    """What ragsieve ranks in-process: the server must answer the same order."""
    from ragsieve.registry import load_reranker

    return [r.index for r in load_reranker("bm25").rank(query, docs).results]


@pytest.fixture(scope="module")
def bm25_server():
    with BackgroundServer(create_app(ServeConfig(reranker="bm25", model_name="ragsieve-bm25"))) as server:
        yield server


@pytest.fixture(scope="module")
def tiny_ce(tiny_cross_encoder_dir):
    """The tiny cross-encoder with a 64-token window, so ~100-word documents need chunks."""
    from ragsieve.rerank.neural import CrossEncoderRanker

    return CrossEncoderRanker(str(tiny_cross_encoder_dir), max_length=64)


def _served(ranker, **options):
    from ragsieve.serve.batcher import PairBatcher
    from ragsieve.serve.models import ServedModels

    config = ServeConfig(reranker="cross-encoder:tiny", **options)
    return config, ServedModels(
        ranker, PairBatcher(ranker, max_wait_ms=config.max_wait_ms, max_batch_tokens=config.max_batch_tokens,
                            max_slice_tokens=config.max_slice_tokens, max_batch_pairs=config.max_batch_pairs)
    )


@pytest.fixture(scope="module")
def ce_server(tiny_ce):
    config, served = _served(
        tiny_ce,
        max_chunks_per_doc=3,
        max_wait_ms=50,
        max_documents=20,
        max_document_chars=5000,
        max_body_bytes=64 * 1024,
    )
    with BackgroundServer(create_app(config, served)) as server:
        server.served = served
        yield server


def test_cohere_v2_client_gets_the_expected_order(bm25_server):
    cohere = pytest.importorskip("cohere")
    client = cohere.ClientV2(base_url=bm25_server.url, api_key="unused")
    response = client.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS, top_n=2)
    assert [r.index for r in response.results] == offline_order()[:2]
    assert {r.index for r in response.results} == {1, 3}  # the two Hamlet passages
    assert response.results[0].relevance_score >= response.results[1].relevance_score > 0
    assert response.meta.api_version.version == "2"


@pytest.fixture(scope="module")
def calibrated_server():
    """BM25 with a calibration, served the way the shipped reranker is: scores are its predict_proba."""
    from ragsieve.rerank.calibration import Calibration
    from ragsieve.rerank.lexical import BM25Ranker

    ranker = BM25Ranker()
    ranker.calibration = Calibration(temperature=0.2, bias=-1.5)
    config, served = _served(ranker)
    with BackgroundServer(create_app(config, served)) as server:
        server.ranker = ranker
        yield server


def test_scores_are_calibrated_probabilities_for_the_cohere_client_and_tei(calibrated_server):
    cohere = pytest.importorskip("cohere")
    ranker = calibrated_server.ranker
    proba = ranker.predict_proba(QUERY, DOCS)
    client = cohere.ClientV2(base_url=calibrated_server.url, api_key="unused")
    response = client.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS)
    assert [r.index for r in response.results] == offline_order()
    got = {r.index: r.relevance_score for r in response.results}
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], proba, atol=1e-9)
    assert all(0.0 <= s <= 1.0 for s in got.values()) and max(got.values()) > 0.5 > min(got.values())
    # a raw TEI body: score is the same probability; raw_scores returns the ranker's own score
    for raw_scores, expected in ((False, proba), (True, ranker.score(QUERY, as_passages(DOCS)))):
        body = {"query": QUERY, "texts": DOCS, "raw_scores": raw_scores}
        r = httpx.post(f"{calibrated_server.url}/rerank", json=body)
        assert r.status_code == 200, r.text
        tei = {x["index"]: x["score"] for x in r.json()}
        assert [x["index"] for x in r.json()] == offline_order()
        np.testing.assert_allclose([tei[i] for i in range(len(DOCS))], expected, atol=1e-9)
    assert not np.allclose(expected, proba)  # raw_scores really is another scale


def test_uncalibrated_scores_are_the_logistic_of_the_raw_score(bm25_server):
    from scipy.special import expit

    from ragsieve.registry import load_reranker

    data = httpx.post(f"{bm25_server.url}/v1/rerank", json={"query": QUERY, "documents": DOCS}).json()
    got = {x["index"]: x["relevance_score"] for x in data["results"]}
    raw = load_reranker("bm25").score(QUERY, as_passages(DOCS))
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], expit(raw))
    assert all(0.0 <= s <= 1.0 for s in got.values())


def test_bm25_over_stopword_only_documents_answers_zero_scores(bm25_server):
    r = httpx.post(f"{bm25_server.url}/v1/rerank", json={"query": QUERY, "documents": ["a", "the"]})
    assert r.status_code == 200, r.text
    assert sorted(x["relevance_score"] for x in r.json()["results"]) == [0.5, 0.5]  # logistic of a zero score


def test_open_webui_and_dify_style_raw_json(bm25_server):
    # Open WebUI's external reranker: POST {model, query, documents, top_n} with a Bearer key
    body = {"model": "bge-reranker-v2-m3", "query": QUERY, "documents": DOCS, "top_n": 4}
    r = httpx.post(f"{bm25_server.url}/v1/rerank", json=body, headers={"Authorization": "Bearer x"})
    assert r.status_code == 200, r.text
    data = r.json()
    assert [x["index"] for x in data["results"]] == offline_order()
    assert all(set(x) == {"index", "relevance_score"} for x in data["results"])
    assert data["model"] == "ragsieve-bm25" and r.headers["x-request-id"] == data["meta"]["request_id"]
    # Dify / Jina: documents back as {text}, objects accepted as documents, unknown fields ignored
    body = {
        "model": "jina-reranker-v2",
        "query": QUERY,
        "documents": [{"text": d} for d in DOCS],
        "return_documents": True,
        "top_n": 1,
        "rank_fields": ["text"],
    }
    data = httpx.post(f"{bm25_server.url}/rerank", json=body).json()
    top = offline_order()[0]
    assert data["results"] == [
        {"index": top, "relevance_score": data["results"][0]["relevance_score"], "document": {"text": DOCS[top]}}
    ]


def test_tei_body_on_rerank_answers_in_tei_shape(bm25_server):
    r = httpx.post(f"{bm25_server.url}/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
    assert r.status_code == 200, r.text
    data = r.json()
    assert isinstance(data, list) and [x["index"] for x in data] == offline_order()
    assert set(data[0]) == {"index", "score", "text"} and data[0]["text"] == DOCS[data[0]["index"]]


def test_scores_equal_offline_scoring_and_long_documents_are_chunked(ce_server, tiny_ce):
    long_doc = " ".join(["Hamlet was written by William Shakespeare in Denmark."] * 12)  # > 64 tokens
    huge_doc = " ".join(["the lazy dog sleeps"] * 200)  # more than 3 chunks
    docs = [DOCS[0], long_doc, DOCS[1], huge_doc]
    data = httpx.post(f"{ce_server.url}/v1/rerank", json={"query": QUERY, "documents": docs}).json()
    scores = {r["index"]: r["relevance_score"] for r in data["results"]}
    offline = tiny_ce.score(QUERY, [DOCS[0], DOCS[1]])
    assert scores[0] == pytest.approx(offline[0], abs=1e-5) and scores[2] == pytest.approx(offline[1], abs=1e-5)
    meta = data["meta"]
    assert meta["chunked_documents"]["1"] >= 2 and meta["chunked_documents"]["3"] == 3
    assert meta["truncated_documents"] == [3] and len(meta["warnings"]) == 2
    from ragsieve.rerank.chunks import plan_chunks

    plan = plan_chunks(tiny_ce, QUERY, [long_doc], 3)
    assert scores[1] == pytest.approx(tiny_ce.score(QUERY, plan.texts).max(), abs=1e-5)
    # every chunk fits the window beside the query: the model never cuts one again
    tok = tiny_ce.model.tokenizer
    assert all(len(tok(QUERY, t)["input_ids"]) <= 64 for t in plan.texts)
    # the same reading in Python: BestChunkRanker scores as serve does (the truncated tail of a huge doc aside)
    from ragsieve.rerank.chunks import BestChunkRanker

    best = BestChunkRanker(tiny_ce, max_chunks_per_doc=3).score(QUERY, as_passages(docs))
    np.testing.assert_allclose(best, [scores[i] for i in range(len(docs))], atol=1e-5)


def test_a_loaded_reranker_reads_whole_passages_and_stays_the_model_it_wraps(tiny_cross_encoder_dir, tiny_ce):
    """load_reranker wraps a model with a window once, passes attributes and calibration through, pickles (Ray
    ships rankers to workers), and leaves a ranker without a window (BM25) as it is."""
    import pickle

    from ragsieve.registry import load_reranker
    from ragsieve.rerank.calibration import Calibration
    from ragsieve.rerank.chunks import BestChunkRanker, reading_whole, window_reader
    from ragsieve.rerank.neural import CrossEncoderRanker

    long_doc = " ".join(["Hamlet was written by William Shakespeare in Denmark."] * 12)  # > 64 tokens
    ranker = load_reranker(f"cross-encoder:{tiny_cross_encoder_dir}", max_length=64)
    assert isinstance(ranker, BestChunkRanker) and isinstance(window_reader(ranker), CrossEncoderRanker)
    assert reading_whole(ranker) is ranker and ranker.window() is None and ranker.name == ranker.ranker.name
    assert ranker.model is ranker.ranker.model and ranker.score_is_probability
    expected = BestChunkRanker(tiny_ce).score(QUERY, as_passages([DOCS[0], long_doc]))
    np.testing.assert_allclose(ranker.score(QUERY, [DOCS[0], long_doc]), expected, atol=1e-5)
    first_window = load_reranker(f"cross-encoder:{tiny_cross_encoder_dir}", max_length=64, whole_passages=False)
    assert isinstance(first_window, CrossEncoderRanker)
    ranker.calibration = Calibration(temperature=2.0, bias=0.0)  # set through: the model's own scale
    assert ranker.ranker.calibration.temperature == 2.0 and ranker.predict_proba(QUERY, [DOCS[0]]).shape == (1,)
    copy = pickle.loads(pickle.dumps(ranker))
    np.testing.assert_allclose(copy.score(QUERY, [long_doc]), ranker.score(QUERY, [long_doc]), atol=1e-5)
    assert type(load_reranker("bm25")).__name__ == "BM25Ranker"
    # serve's own cap on chunks holds for the ranker it loads too, so /v1/filter reads a passage as /v1/rerank does
    from ragsieve.serve.models import ServedModels

    served = ServedModels.load(ServeConfig(reranker=f"cross-encoder:{tiny_cross_encoder_dir}", max_chunks_per_doc=3))
    assert isinstance(served.ranker, BestChunkRanker) and served.ranker.max_chunks_per_doc == 3


def test_the_default_reranker_reads_a_long_document_to_its_end(monkeypatch):
    """`embedded:base` (two models behind one score) and its ONNX fallback state their window, so serve chunks a
    document longer than it: a passage whose answer sits past the window still ranks first."""
    from ragsieve.registry import load_reranker
    from ragsieve.rerank.chunks import plan_chunks

    filler = " ".join(["The committee met again to discuss the budget for the coming year."] * 40)  # ≈ 560 tokens
    long_doc = f"{filler} Hamlet was written by William Shakespeare."
    docs = ["Paris is the capital of France.", long_doc, "The quick brown fox jumps over the lazy dog."]
    for options in ({}, {"backend": "onnx-int8", "cosine_backend": "onnx-int8"}):
        ranker = load_reranker("embedded:base", whole_passages=False, **options)
        tokenizer, limit = ranker.window()
        assert limit == 256, options
        plan = plan_chunks(ranker, QUERY, docs, 8)
        assert plan.chunked[1] >= 3 and not plan.truncated
        assert all(len(tokenizer(QUERY, t)["input_ids"]) <= limit for t in plan.texts)
    first_window = load_reranker("embedded:base", whole_passages=False)
    assert first_window.score(QUERY, as_passages(docs)).argmax() != 1  # the answer past the window is never seen
    with BackgroundServer(create_app(ServeConfig())) as server:
        data = httpx.post(f"{server.url}/v1/rerank", json={"query": QUERY, "documents": docs}).json()
    assert data["results"][0]["index"] == 1 and data["meta"]["chunked_documents"]["1"] >= 3
    # the one sieve (Python's Sieve.filter, the adapters, the pipeline) reads it the same way
    from ragsieve.pipeline.stages import SieveStages

    ranker = load_reranker("embedded:base")
    kept = SieveStages(ranker, None, top_k=1).select(QUERY, docs)
    assert kept.selected_results[0].index == 1
    served_score = data["results"][0]["relevance_score"]
    assert ranker.unit_scores([kept.selected_results[0].score])[0] == pytest.approx(served_score, abs=1e-3)
    # in Python too: score() ranks it first and predict_proba() is the relevance_score the API answered
    served = {r["index"]: r["relevance_score"] for r in data["results"]}
    assert ranker.score(QUERY, as_passages(docs)).argmax() == 1
    np.testing.assert_allclose(ranker.predict_proba(QUERY, docs), [served[i] for i in range(len(docs))], atol=1e-3)
    # and the shipped grader (a threshold on the same score) grades it on that chunk, not on its first window
    from ragsieve.registry import load_grader

    grader = load_grader("embedded:default")
    np.testing.assert_allclose(grader.score_pairs([QUERY], [long_doc]), [kept.selected_results[0].score], atol=1e-3)


def test_tei_raw_scores_are_logits_of_a_sigmoid_cross_encoder(ce_server, tiny_ce):
    from scipy.special import logit

    probability = tiny_ce.score(QUERY, as_passages(DOCS))
    for raw_scores, expected in ((False, probability), (True, logit(probability))):
        r = httpx.post(f"{ce_server.url}/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": raw_scores})
        got = {x["index"]: x["score"] for x in r.json()}
        np.testing.assert_allclose([got[i] for i in range(len(DOCS))], expected, atol=1e-4)


def test_concurrent_requests_share_batches_and_get_their_own_scores(ce_server, tiny_ce):
    queries = [f"{QUERY} {i}" for i in range(12)]

    async def fire():
        async with httpx.AsyncClient(base_url=ce_server.url, timeout=60) as client:
            return await asyncio.gather(
                *[client.post("/v1/rerank", json={"query": q, "documents": DOCS}) for q in queries]
            )

    before = ce_server.served.rank_batcher.stats.max_batch_jobs
    responses = asyncio.run(fire())
    assert all(r.status_code == 200 for r in responses)
    for q, r in zip(queries, responses):
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        np.testing.assert_allclose([got[i] for i in range(len(DOCS))], tiny_ce.score(q, DOCS), atol=1e-5)
    assert max(before, ce_server.served.rank_batcher.stats.max_batch_jobs) > 1  # requests were batched together


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"query": QUERY, "documents": ["a"] * 21}, 413, "documents"),
        ({"query": QUERY, "documents": ["a", "b" * 5001]}, 413, "documents.1"),
        ({"query": "q" * 10_001, "documents": ["a"]}, 413, "query"),
        ({"query": QUERY, "documents": [3]}, 422, "documents.0"),
        ({"query": QUERY}, 422, "documents"),
        ({"query": "  ", "documents": ["a"]}, 422, "query"),
        ({"query": QUERY, "documents": ["a"], "top_n": 0}, 422, "top_n"),
    ],
)
def test_bad_or_over_limit_input_is_a_4xx_naming_the_field(ce_server, body, status, field):
    r = httpx.post(f"{ce_server.url}/v1/rerank", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error.startswith(field) or f"{field}:" in error or f".{field}" in error, error


def test_oversized_or_broken_bodies_are_refused(ce_server):
    r = httpx.post(
        f"{ce_server.url}/v1/rerank", content=b"x" * (65 * 1024), headers={"content-type": "application/json"}
    )
    assert r.status_code == 413 and r.json()["error"].startswith("body")
    r = httpx.post(
        f"{ce_server.url}/v1/rerank",
        content=b'{"query": "q", "documents": [',
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    # a lone surrogate is legal JSON but not UTF-8: refused naming the field, never a 500
    raw = b'{"query": "who \\ud800", "documents": ["x \\udfff y", ""], "return_documents": true}'
    r = httpx.post(f"{ce_server.url}/v1/rerank", content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["error"].startswith("query"), r.text


def test_api_key_guards_everything_but_health():
    app = create_app(ServeConfig(reranker="bm25", api_key="s3cret"))
    with BackgroundServer(app) as server:
        body = {"query": QUERY, "documents": DOCS}
        assert httpx.get(f"{server.url}/health").status_code == 200
        for method, path in [
            ("POST", "/v1/rerank"),
            ("POST", "/rerank"),
            ("POST", "/v2/rerank"),
            ("POST", "/v1/filter"),
            ("GET", "/v1/models"),
            ("GET", "/openapi.json"),
            ("POST", "/admin/reload"),
        ]:
            r = httpx.request(method, f"{server.url}{path}", json=body)
            assert r.status_code == 401, path
            assert "API key" in r.json()["error"]
        assert (
            httpx.post(f"{server.url}/v1/rerank", json=body, headers={"Authorization": "Bearer wrong"}).status_code
            == 401
        )
        assert (
            httpx.post(f"{server.url}/v1/rerank", json=body, headers={"Authorization": "Bearer s3cret"}).status_code
            == 200
        )
        assert httpx.post(f"{server.url}/v1/rerank", json=body, headers={"X-API-Key": "s3cret"}).status_code == 200
        cohere = pytest.importorskip("cohere")
        assert (
            cohere.ClientV2(base_url=server.url, api_key="s3cret")
            .rerank(model="m", query=QUERY, documents=DOCS)
            .results[0]
            .index
            == offline_order()[0]
        )


def test_health_models_reload_and_openapi(bm25_server):
    assert httpx.get(f"{bm25_server.url}/health").json()["status"] == "ok"
    assert httpx.get(f"{bm25_server.url}/v1/models").json()["data"][0]["id"] == "ragsieve-bm25"
    spec = httpx.get(f"{bm25_server.url}/openapi.json").json()
    assert {"/v1/rerank", "/v2/rerank", "/rerank", "/v1/filter", "/health", "/v1/models"} <= set(spec["paths"])
    assert httpx.post(f"{bm25_server.url}/admin/reload").json()["status"] == "reloaded"
    assert httpx.post(f"{bm25_server.url}/v1/rerank", json={"query": QUERY, "documents": DOCS}).status_code == 200


def test_schemathesis_finds_no_server_error(ce_server):
    """Generated valid and invalid requests for every operation in /openapi.json: zero 5xx."""
    schemathesis = pytest.importorskip("schemathesis")
    from hypothesis import HealthCheck, given, settings
    from hypothesis.errors import Unsatisfiable

    schema = schemathesis.openapi.from_url(f"{ce_server.url}/openapi.json")
    checked = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path == "/admin/reload":
            continue  # reloads models: covered above, too slow to fuzz
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(
                max_examples=12, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
            )
            def run(case):
                response = case.call(base_url=ce_server.url, timeout=60)
                assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])

            try:
                run()
            except Unsatisfiable:  # no invalid request exists for a parameterless GET
                assert mode == schemathesis.GenerationMode.NEGATIVE and operation.method.upper() == "GET"
                continue
            checked += 1
    assert checked >= 8


def test_cli_bad_spec_is_one_line_error(cli):
    result = cli("serve", "--reranker", "nonsense")
    assert result.code == 2 and "unknown reranker spec 'nonsense'" in result.err


def test_cli_serve_answers_the_cohere_client_on_loopback(tmp_path):
    """`ragsieve serve` in its own process: prints its URL, binds 127.0.0.1, needs the env API key."""
    import os
    import subprocess
    import sys

    cfg = tmp_path / "serve.yaml"
    cfg.write_text("max_documents: 3\n")
    env = {**os.environ, "RAGSIEVE_API_KEY": "k3y"}
    code = "import sys; from ragsieve.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "serve", "-r", "bm25", "--port", "0", "-c", str(cfg), "--log-level", "warning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("ragsieve serve: http://127.0.0.1:") and "API key required" in line, line
        url = line.split()[2]
        cohere = pytest.importorskip("cohere")
        result = cohere.ClientV2(base_url=url, api_key="k3y").rerank(model="m", query=QUERY, documents=DOCS[:3])
        assert result.results[0].index == offline_order(QUERY, DOCS[:3])[0]
        r = httpx.post(f"{url}/v1/rerank", json={"query": QUERY, "documents": DOCS}, headers={"X-API-Key": "k3y"})
        assert r.status_code == 413 and "max_documents is 3" in r.json()["error"]
        assert httpx.post(f"{url}/v1/rerank", json={"query": QUERY, "documents": DOCS[:2]}).status_code == 401
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_request_ids_are_echoed_and_logged(bm25_server, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="ragsieve.serve"):
        r = httpx.post(
            f"{bm25_server.url}/v1/rerank",
            json={"query": QUERY, "documents": DOCS},
            headers={"x-request-id": "client-42"},
        )
        bad = httpx.post(f"{bm25_server.url}/v1/rerank", json={"query": QUERY})
    assert r.headers["x-request-id"] == "client-42" and r.json()["meta"]["request_id"] == "client-42"
    assert bad.json()["request_id"] == bad.headers["x-request-id"] != "client-42"
    lines = [rec.getMessage() for rec in caplog.records]
    assert any("rid=client-42 POST /v1/rerank 200" in line for line in lines), lines
    assert any(f"rid={bad.headers['x-request-id']} POST /v1/rerank 422" in line for line in lines), lines


def test_a_closed_batcher_refuses_new_work_instead_of_hanging():
    from ragsieve.registry import load_reranker
    from ragsieve.serve.batcher import PairBatcher
    from ragsieve.serve.errors import ServeError

    batcher = PairBatcher(load_reranker("bm25"), max_wait_ms=1)
    assert len(asyncio.run(batcher.score([(QUERY, DOCS[1])]))) == 1
    batcher.close()
    with pytest.raises(ServeError, match="reloaded"):
        asyncio.run(batcher.score([(QUERY, DOCS[1])]))


def test_a_list_level_ranker_scores_each_request_whole_and_alone():
    """A cascade's scores depend on the list: the batcher neither slices a request nor mixes it with others."""
    from ragsieve.registry import load_reranker
    from ragsieve.serve.batcher import PairBatcher

    cascade = load_reranker("cascade:2:bm25")
    docs = [f"{d} {i}" for i, d in enumerate(DOCS * 3)]
    batcher = PairBatcher(cascade, max_wait_ms=20, max_batch_pairs=2)  # a pointwise ranker would be sliced

    async def both():
        return await asyncio.gather(batcher.score([(QUERY, d) for d in docs]),
                                    batcher.score([("paris france", d) for d in docs[:4]]))

    first, second = asyncio.run(both())
    batcher.close()
    assert np.allclose(first, cascade.score(QUERY, docs)) and np.allclose(second, cascade.score("paris france", docs[:4]))


def test_a_short_request_joins_the_next_call_and_scores_as_it_would_alone(tiny_ce):
    """Token budget + admission: a 1-pair request sent while a 600-pair one waits is answered before the big one
    is done (it joins the next call, not the back of the queue), and every score equals the pair scored alone."""
    from ragsieve.serve.batcher import PairBatcher

    batcher = PairBatcher(tiny_ce, max_wait_ms=0, max_slice_tokens=256)  # a few pairs a call
    big = [(QUERY, DOCS[i % len(DOCS)] + f" part {i}") for i in range(600)]

    async def both():
        hog = asyncio.ensure_future(batcher.score(big))
        await asyncio.sleep(0.05)  # the big request is admitted and scoring
        small = await batcher.score([("paris france", DOCS[1])])
        big_done_first = hog.done()
        return small, await hog, big_done_first

    try:
        small, big_scores, big_done_first = asyncio.run(both())
    finally:
        batcher.close()
    assert not big_done_first
    np.testing.assert_allclose(small, tiny_ce.score_pairs(["paris france"], [DOCS[1]]), atol=1e-5)
    np.testing.assert_allclose(big_scores[:20], tiny_ce.score_pairs(*zip(*big[:20])), atol=1e-5)
    assert batcher.stats.pairs == 601


def test_a_long_document_is_chunked_and_scored_by_its_best_chunk(ce_server):
    body = {"query": QUERY, "documents": [" ".join(["Hamlet by Shakespeare."] * 40), DOCS[0]]}
    first = httpx.post(f"{ce_server.url}/v1/rerank", json=body).json()
    again = httpx.post(f"{ce_server.url}/v1/rerank", json=body).json()
    assert again["results"] == first["results"]
    assert first["meta"]["chunked_documents"] == {"0": 3}


def test_pickled_weights_are_refused(tmp_path, tiny_cross_encoder_dir, cli):
    import shutil

    folder = tmp_path / "pickled"
    shutil.copytree(tiny_cross_encoder_dir, folder)
    for f in folder.glob("*.safetensors"):
        f.unlink()
    (folder / "pytorch_model.bin").write_bytes(b"not even loaded")
    result = cli("serve", "--reranker", f"cross-encoder:{folder}")
    assert result.code == 2 and "safetensors only" in result.err
    from ragsieve.serve.models import refuse_pickled_weights

    refuse_pickled_weights(f"cross-encoder:{tiny_cross_encoder_dir}")  # the safetensors folder passes


def test_a_router_serves_alone_on_the_shared_state():
    """Each endpoint family is an APIRouter: mounted alone on an app holding a ServeState, it answers."""
    from fastapi import FastAPI

    from ragsieve.serve.routes.filter import router
    from ragsieve.serve.state import ServeState

    app = FastAPI()
    app.state.serve = ServeState.load(ServeConfig(reranker="bm25", top_k=2))
    app.include_router(router)
    with BackgroundServer(app) as server:
        r = httpx.post(f"{server.url}/v1/filter", json={"query": QUERY, "documents": DOCS, "threshold": 0.0})
        assert r.status_code == 200 and [x["index"] for x in r.json()["results"]] == offline_order()[:2]
        assert r.json()["dropped"] == 2  # cut at the configured top_k
        assert httpx.post(f"{server.url}/v1/rerank", json={"query": QUERY, "documents": DOCS}).status_code == 404
    app.state.serve.models.close()


def test_own_calibration_from_the_cli_is_served_to_the_cohere_client(cli, tmp_path):
    """`ragsieve rerank calibrate` on a user's labelled pairs → `serve --calibration`'s scores are that map."""
    import json

    from ragsieve.registry import load_reranker

    queries = [QUERY, "capital city of france", "lazy dog fox"]
    relevant = {QUERY: {1, 3}, "capital city of france": {0}, "lazy dog fox": {2}}
    pairs = tmp_path / "labels.jsonl"
    pairs.write_text("".join(json.dumps({"query": q, "passage": d, "label": int(i in relevant[q])}) + "\n"
                             for q in queries for i, d in enumerate(DOCS)))
    out = tmp_path / "cal.json"
    result = cli("rerank", "calibrate", pairs, "-r", "bm25", "-o", out, "--folds", "3", "--precision", "0.5")
    assert result.code == 0, result.err
    assert "precision ≥ 0.5: keep relevance_score ≥" in result.out
    assert "calibrated (cross-fitted by query)" in result.out and "bm25 as loaded" in result.out
    fitted = json.loads(out.read_text())
    assert fitted["reranker"] == "bm25" and fitted["pairs"] == 12 and fitted["queries"] == 3
    assert fitted["relevant"] == 4 and set(fitted["ece"]) == {"as_loaded", "calibrated_cross_fitted"}
    assert 0.0 <= fitted["thresholds"]["0.5"]["threshold"] <= 1.0
    assert cli("rerank", "calibrate", pairs, "-r", "bm25", "-o", out).code == 2  # no silent overwrite

    ranker = load_reranker("bm25", calibration=str(out))
    assert ranker.calibration.temperature == pytest.approx(fitted["calibration"]["temperature"])
    with BackgroundServer(create_app(ServeConfig(reranker="bm25", calibration=str(out)))) as server:
        cohere = pytest.importorskip("cohere")
        response = cohere.ClientV2(base_url=server.url, api_key="unused").rerank(model="m", query=QUERY,
                                                                                  documents=DOCS)
    got = {r.index: r.relevance_score for r in response.results}
    np.testing.assert_allclose([got[i] for i in range(len(DOCS))], ranker.predict_proba(QUERY, DOCS), atol=1e-9)
    # a calibration is one model's score scale: another reranker refuses it, in one line, before loading
    refused = cli("serve", "--reranker", "bi-encoder", "--calibration", out)
    assert refused.code == 2 and "was fitted on bm25, not on bi-encoder" in refused.err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"query": "q", "passage": "p", "label": 1}\n{"query": "q", "passage": "", "label": 0}\n')
    result = cli("rerank", "calibrate", bad, "-r", "bm25", "-o", tmp_path / "x.json")
    assert result.code == 2 and f"{bad}:2: 'passage' must be a non-empty string" in result.err
    assert not (tmp_path / "x.json").exists()
