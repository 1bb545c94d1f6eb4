"""Framework adapters against the real LangChain / LlamaIndex / Haystack packages, in-process and over HTTP."""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # tests make no outbound calls

from ragsieve.serve import ServeConfig, create_app
from ragsieve.serve.runner import BackgroundServer

DOCS = [
    "Paris is the capital and largest city of France.",
    "Hamlet is a tragedy written by William Shakespeare around 1600.",
    "The quick brown fox jumps over the lazy dog.",
    "Shakespeare's Hamlet tells of Prince Hamlet of Denmark.",
]
QUERY = "who wrote hamlet shakespeare"


@pytest.fixture(scope="module")
def server():
    with BackgroundServer(create_app(ServeConfig(reranker="bm25", api_key="k"))) as running:
        yield running


@pytest.fixture(scope="module")
def expected():
    """The in-process bm25 ranking: (index, score), best first."""
    from ragsieve.registry import load_reranker

    return [(r.index, r.score) for r in load_reranker("bm25").rank(QUERY, DOCS).results]


@pytest.fixture(params=["in-process", "http"])
def source(request, server):
    return "bm25" if request.param == "in-process" else server.url


@pytest.fixture
def answered(source):
    """A raw bm25 score as the source answers it: raw in-process; over HTTP the [0, 1] score the rerank API
    returns (for uncalibrated bm25 the logistic of the raw score, ``BaseRanker.unit_scores``)."""
    from scipy.special import expit

    return (lambda s: s) if source == "bm25" else (lambda s: float(expit(s)))


def test_langchain_compressor(source, expected, answered):
    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document

    from ragsieve.integrations.langchain import RagsieveCompressor

    compressor = RagsieveCompressor(ranker=source, top_n=2, api_key="k")
    docs = [Document(page_content=t, metadata={"n": i}) for i, t in enumerate(DOCS)]
    out = compressor.compress_documents(docs, QUERY)
    assert [d.metadata["n"] for d in out] == [i for i, _ in expected[:2]]
    scores = [d.metadata["relevance_score"] for d in out]
    assert scores == pytest.approx([answered(s) for _, s in expected[:2]], abs=1e-6)
    kept = RagsieveCompressor(ranker=source, top_n=None, threshold=answered(0.01), api_key="k").compress_documents(
        docs, QUERY)
    assert {d.metadata["n"] for d in kept} == {1, 3}


def test_llama_index_postprocessor(source, expected, answered):
    pytest.importorskip("llama_index.core")
    from llama_index.core.schema import NodeWithScore, TextNode

    from ragsieve.integrations.llama_index import RagsieveRerank

    nodes = [NodeWithScore(node=TextNode(text=t, id_=str(i)), score=0.0) for i, t in enumerate(DOCS)]
    out = RagsieveRerank(ranker=source, top_n=3, api_key="k").postprocess_nodes(nodes, query_str=QUERY)
    assert [n.node.node_id for n in out] == [str(i) for i, _ in expected[:3]]
    assert [n.score for n in out] == pytest.approx([answered(s) for _, s in expected[:3]], abs=1e-6)


def test_haystack_component_in_a_pipeline(source, expected, answered):
    pytest.importorskip("haystack")
    from haystack import Document, Pipeline

    from ragsieve.integrations.haystack import RagsieveRanker

    pipe = Pipeline()
    pipe.add_component("ranker", RagsieveRanker(ranker=source, top_k=2, api_key="k"))
    result = pipe.run(
        {"ranker": {"query": QUERY, "documents": [Document(content=t, id=str(i)) for i, t in enumerate(DOCS)]}}
    )
    docs = result["ranker"]["documents"]
    assert [d.id for d in docs] == [str(i) for i, _ in expected[:2]]
    assert [d.score for d in docs] == pytest.approx([answered(s) for _, s in expected[:2]], abs=1e-6)


def test_remote_ranker_reports_server_errors_in_one_line(server):
    from ragsieve.errors import RagsieveError
    from ragsieve.rerank.remote import RemoteRanker

    with pytest.raises(RagsieveError, match="answered 401"):
        RemoteRanker(server.url, api_key="wrong").rank(QUERY, DOCS)


def test_the_one_resolver_reads_urls_specs_and_rankers(server, expected):
    """Every scheme resolves in ragsieve.registry: a URL is a RemoteRanker that scores as the server answers."""
    from scipy.special import expit

    from ragsieve.registry import RERANKERS, load_reranker, parse_reranker_spec
    from ragsieve.rerank.remote import RemoteRanker

    remote = load_reranker(server.url, api_key="k")
    assert isinstance(remote, RemoteRanker) and RERANKERS["http"] is RemoteRanker
    ranked = remote.rank(QUERY, DOCS).results
    assert [r.index for r in ranked] == [i for i, _ in expected]
    assert [r.score for r in ranked] == pytest.approx([float(expit(s)) for _, s in expected], abs=1e-6)
    assert load_reranker(remote) is remote
    assert parse_reranker_spec("evolve:state/x") == ("evolve", "state/x")
    assert parse_reranker_spec("hf:org/model") == ("hf", "org/model") and parse_reranker_spec("bm25") == ("bm25", None)


def test_every_adapter_applies_a_fitted_sieve_as_sieve_filter_does(tmp_path):
    """sieve=: LangChain, LlamaIndex and Haystack keep what Sieve.filter keeps (rerank → top_k → grade)."""
    from ragsieve.pipeline import Sieve, SieveConfig
    from ragsieve.registry import new_grader

    folder = tmp_path / "sieve"
    new_grader("ranker", base="bm25", threshold=0.1).save(folder / "grader")
    Sieve(SieveConfig(reranker="bm25", grader="grader", top_k=3)).save(folder)  # the LLM never loads
    expected = [(r.index, r.score) for r, _ in Sieve.load(folder).filter(QUERY, DOCS).kept_results]
    assert len(expected) == 2
    got = {}
    if importlib.util.find_spec("langchain_core"):
        from langchain_core.documents import Document

        from ragsieve.integrations.langchain import RagsieveCompressor

        out = RagsieveCompressor(sieve=str(folder)).compress_documents(
            [Document(page_content=t, metadata={"n": i}) for i, t in enumerate(DOCS)], QUERY)
        got["langchain"] = [(d.metadata["n"], d.metadata["relevance_score"]) for d in out]
    if importlib.util.find_spec("llama_index"):
        from llama_index.core.schema import NodeWithScore, TextNode

        from ragsieve.integrations.llama_index import RagsieveRerank

        nodes = [NodeWithScore(node=TextNode(text=t, id_=str(i)), score=0.0) for i, t in enumerate(DOCS)]
        out = RagsieveRerank(sieve=str(folder)).postprocess_nodes(nodes, query_str=QUERY)
        got["llama_index"] = [(int(n.node.node_id), n.score) for n in out]
    if importlib.util.find_spec("haystack"):
        from haystack import Document

        from ragsieve.integrations.haystack import RagsieveRanker

        out = RagsieveRanker(sieve=str(folder)).run(QUERY, [Document(content=t, id=str(i)) for i, t in enumerate(DOCS)])
        got["haystack"] = [(int(d.id), d.score) for d in out["documents"]]
    assert got
    for name, kept in got.items():
        assert [i for i, _ in kept] == [i for i, _ in expected], name
        assert [s for _, s in kept] == pytest.approx([s for _, s in expected], abs=1e-6), name
