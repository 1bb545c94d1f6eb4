"""/v1/gate and /v1/ask on a real loopback server with the tiny LLM and a (random) tiny probe."""

from __future__ import annotations

import httpx
import pytest

from ragsieve.serve import ServeConfig, create_app
from ragsieve.serve.runner import BackgroundServer


@pytest.fixture(scope="module")
def tiny_probe_dir(tiny_llm, tmp_path_factory):
    from ragsieve.probe.model import ConfidenceProbe, ProbeConfig, ProbeHead

    cfg = ProbeConfig(
        llm_spec=tiny_llm.spec,
        layer=2,
        num_layers=tiny_llm.num_layers,
        hidden_size=tiny_llm.hidden_size,
        probe_hidden=8,
        max_prompt_tokens=450,
    )
    return ConfidenceProbe(tiny_llm, ProbeHead(tiny_llm.hidden_size, 8), cfg).save(tmp_path_factory.mktemp("probe"))


def test_gate_and_ask(tiny_llm, tiny_llm_dir, tiny_probe_dir):
    config = ServeConfig(
        reranker="bm25",
        llm=str(tiny_llm_dir),
        probe=str(tiny_probe_dir),
        cbdr_beta=0.5,
        max_new_tokens=3,
        max_wait_ms=30,
    )
    with BackgroundServer(create_app(config)) as server:
        offline = tiny_llm  # same weights: the served Conf(Q) equals the in-process probe's
        from ragsieve.registry import load_probe

        expected = load_probe(str(tiny_probe_dir), offline).score("Who wrote Hamlet?")
        r = httpx.post(f"{server.url}/v1/gate", json={"query": "Who wrote Hamlet?"}, timeout=120)
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["confidence"] == pytest.approx(expected, abs=1e-5)
        assert data["retrieve"] == (data["confidence"] <= 0.5) and data["beta"] == 0.5
        r = httpx.post(f"{server.url}/v1/gate", json={"query": "Who wrote Hamlet?", "beta": 1.0}, timeout=120)
        assert r.json()["retrieve"] is True
        r = httpx.post(f"{server.url}/v1/ask", json={"query": "Who wrote Hamlet?"}, timeout=120)
        assert r.status_code == 200, r.text
        data = r.json()
        assert isinstance(data["answer"], str) and data["retrieved"] is False and data["contexts"] == []
        assert httpx.post(f"{server.url}/v1/ask", json={"query": " "}, timeout=60).status_code == 422


def test_gate_and_ask_without_an_llm_are_400():
    with BackgroundServer(create_app(ServeConfig(reranker="bm25"))) as server:
        for path in ("/v1/gate", "/v1/ask"):
            r = httpx.post(f"{server.url}{path}", json={"query": "q"})
            assert r.status_code == 400 and "no LLM configured" in r.json()["error"]


@pytest.fixture(scope="module")
def sieve_dir(tiny_llm, tiny_probe_dir, tmp_path_factory):
    """A hand-made sieve for the tiny LLM: its probe, β = 1 (always retrieve), bm25 reranker and grader."""
    import shutil

    from ragsieve.pipeline import Sieve, SieveConfig
    from ragsieve.registry import new_grader

    folder = tmp_path_factory.mktemp("sieve")
    shutil.copytree(tiny_probe_dir, folder / "probe")
    new_grader("ranker", base="bm25", threshold=0.1).save(folder / "grader")
    Sieve(
        SieveConfig(
            llm=tiny_llm.spec,
            probe="probe",
            layer=2,
            beta=1.0,
            policy="fixed",
            reranker="bm25",
            grader="grader",
            top_k=2,
            candidates=3,
            max_new_tokens=2,
        )
    ).save(folder)
    return folder


def test_serve_a_sieve(sieve_dir, cli):
    docs = ["Paris is the capital of France.", "Hamlet was written by Shakespeare.", "Cats sleep."]
    with BackgroundServer(create_app(ServeConfig(sieve=str(sieve_dir)))) as server:
        models = httpx.get(f"{server.url}/v1/models").json()["data"]
        assert [m["id"] for m in models] == [f"sieve:{sieve_dir.name}", str(sieve_dir / "grader")]
        r = httpx.post(f"{server.url}/v1/filter", json={"query": "who wrote hamlet shakespeare", "documents": docs})
        assert r.status_code == 200 and [x["index"] for x in r.json()["results"]] == [1], r.text
        gate = httpx.post(f"{server.url}/v1/gate", json={"query": "Who wrote Hamlet?"}, timeout=120).json()
        assert gate["beta"] == 1.0 and gate["retrieve"] is True
    result = cli("serve", "--sieve", sieve_dir, "--reranker", "bm25")
    assert result.code == 2 and "a sieve brings its own stages" in result.err
