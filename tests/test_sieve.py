"""A sieve folder loads through Sieve.load and each stage acts: gate, reranker, grader; `ask --sieve --explain`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError

QUESTIONS = ["who is the author of hamlet", "what do plants make from light"]
DOCS = [
    Passage("stuffed", "Hamlet, hamlet, hamlet: a hamlet is a small village. Hamlet villages.", "Hamlet (place)"),
    Passage("answer", "Hamlet is a tragedy written by William Shakespeare around 1600.", "Hamlet"),
    Passage("off", "Photosynthesis converts light energy into chemical energy, says the author.", "Photosynthesis"),
]


@pytest.fixture
def sieve_dir(tmp_path, tiny_llm):
    """A hand-made sieve for the tiny LLM: a random probe with β between two questions' Conf(Q),
    MiniLM cosine as the reranker and as a thresholded grader."""
    from ragsieve.pipeline import Sieve, SieveConfig
    from ragsieve.probe.model import ConfidenceProbe, ProbeConfig, ProbeHead
    from ragsieve.registry import new_grader

    folder = tmp_path / "sieve"
    probe = ConfidenceProbe(tiny_llm, ProbeHead(tiny_llm.hidden_size, 8), ProbeConfig(
        llm_spec=tiny_llm.spec, layer=2, num_layers=tiny_llm.num_layers, hidden_size=tiny_llm.hidden_size,
        probe_hidden=8, max_prompt_tokens=400))
    conf = probe.score_batch(QUESTIONS)
    assert conf[0] != conf[1]
    probe.save(folder / "probe")
    new_grader("cosine", threshold=0.25).save(folder / "grader")
    config = SieveConfig(llm=tiny_llm.spec, probe="probe", layer=2, beta=float(conf.mean()), policy="fixed",
                         reranker="bi-encoder", grader="grader", top_k=2, candidates=3, max_prompt_tokens=400,
                         max_new_tokens=2)
    Sieve(config).save(folder)
    return folder, conf


def test_sieve_load_and_each_stage_acts(sieve_dir, tiny_llm):
    from ragsieve import Sieve

    folder, conf = sieve_dir
    sieve = Sieve.load(folder, llm=tiny_llm)
    decisions = [sieve.should_retrieve(q) for q in QUESTIONS]
    assert [d.retrieve for d in decisions] == [bool(c <= conf.mean()) for c in conf]  # one skips, one retrieves
    assert sorted(d.retrieve for d in decisions) == [False, True]
    ranked = sieve.rerank(QUESTIONS[0], DOCS)
    assert ranked.results[0].passage.id == "answer"  # MiniLM puts the answer first; the input had it second
    kept = sieve.filter(QUESTIONS[0], DOCS[::-1])
    assert [p.id for p in kept.selected] == ["answer", "stuffed"]
    kept = sieve.filter(QUESTIONS[0], [DOCS[2], DOCS[1]])
    assert [p.id for p in kept.kept] == ["answer"] and [v.relevant for v in kept.verdicts] == [True, False]


def test_a_sieve_built_from_a_changed_config_runs_as_changed(sieve_dir, tiny_llm):
    """Sieve(config, folder) uses the config it is given (components still found in the folder), not the folder's
    sieve.json: how a study tries a grid point of a fitted sieve without writing a folder."""
    from ragsieve import Sieve

    folder, _ = sieve_dir
    loaded = Sieve.load(folder, llm=tiny_llm)
    assert [p.id for p in loaded.filter(QUESTIONS[0], DOCS).selected] == ["answer", "stuffed"]
    changed = Sieve(loaded.config.model_copy(update={"top_k": 1, "grader": None}), folder, llm=tiny_llm)
    kept = changed.filter(QUESTIONS[0], DOCS)
    assert [p.id for p in kept.kept] == ["answer"] and not kept.verdicts
    assert changed.gate is not None  # the probe, in the folder, still loads by its relative name


def test_sieve_answer_traces_every_stage(sieve_dir, tiny_llm, tmp_path):
    from ragsieve import Sieve
    from ragsieve.retrieve import build_index

    folder, conf = sieve_dir
    index = build_index(DOCS, tmp_path / "idx", kind="bm25")
    retrieving = QUESTIONS[int(np.argmin(conf))]
    answer = Sieve.load(folder, llm=tiny_llm).answer(retrieving, retriever=index)
    assert answer.retrieved and answer.confidence == pytest.approx(conf.min(), abs=1e-5)
    assert answer.candidates and all(c.rerank_rank is not None for c in answer.candidates)
    assert answer.prompt_tokens and json.dumps(answer.to_dict())


def test_ask_with_sieve_explains_and_speaks_json(sieve_dir, tmp_path, cli):
    from ragsieve.retrieve import build_index

    folder, conf = sieve_dir
    build_index(DOCS, tmp_path / "idx", kind="bm25")
    question = QUESTIONS[int(np.argmin(conf))]
    result = cli("ask", question, "--index", tmp_path / "idx", "--sieve", folder, "--explain")
    assert result.code == 0, result.err
    assert "gate" in result.out and "β" in result.out and "candidates" in result.out and "prompt" in result.out
    result = cli("ask", question, "--index", tmp_path / "idx", "--sieve", folder, "--json")
    data = json.loads(result.out)
    assert data["retrieved"] and data["beta"] == pytest.approx(float(conf.mean()))
    assert {c["id"] for c in data["candidates"]} <= {"stuffed", "answer", "off"}
    both = cli("ask", question, "--index", tmp_path / "idx", "--sieve", folder, "--reranker", "bm25")
    assert both.code == 2 and "drop --reranker" in both.err


def test_not_a_sieve_is_one_line(tmp_path):
    from ragsieve import Sieve

    with pytest.raises(RagsieveError, match="not a sieve .*ragsieve fit"):
        Sieve.load(tmp_path)
    (tmp_path / "sieve.json").write_text('{"beta": 3}')
    with pytest.raises(RagsieveError, match="beta"):
        Sieve.load(tmp_path)


def test_the_shipped_default_sieve_is_complete_small_and_loads_by_name():
    """`embedded:default` (and a bare `default`) resolve to the shipped sieve: safetensors weights
    only, each ≤ 50 MB, every component it names present, fitted for the embedded SmolLM2."""
    from ragsieve.models.specs import DEFAULT_LLM, ModelSpec
    from ragsieve.paths import ASSETS_DIR
    from ragsieve.pipeline.sieve_config import read_sieve_config, resolve_component, sieve_folder

    folder = sieve_folder("embedded:default")
    assert folder == ASSETS_DIR / "sieves" / "default" == sieve_folder("default")
    config = read_sieve_config("embedded:default")
    assert str(ModelSpec.parse(config.llm)) == str(ModelSpec.parse(DEFAULT_LLM))
    # every folder it names is shipped, and nothing else: an aligned reranker it did not choose stays out
    named = {config.probe, config.grader, config.reranker} - {None}
    for part in named - {"embedded:base"}:
        assert (folder / part).is_dir() and resolve_component(folder, part) == str(folder / part), part
    assert {p.name for p in folder.iterdir() if p.is_dir()} <= named
    files = [f for f in folder.rglob("*") if f.is_file()]
    assert not any("work" in f.relative_to(folder).parts for f in files)
    assert all(f.suffix in {".json", ".safetensors", ".txt", ".png"} for f in files), files
    assert all(f.stat().st_size <= 50 * 2**20 for f in files)
    # chosen by answers on dev, checked against the best plain configuration on test (issue #39)
    assert {"test", "retrieval_rate", "do_no_harm", "selection"} <= set(config.metrics)
    assert not config.metrics["do_no_harm"]["chosen_vs_best_plain"]["measurably_worse"]
    assert (folder / config.metrics["selection"]["plot"]).is_file()


@pytest.mark.integration
def test_the_shipped_default_sieve_filters_with_smollm2(smollm2):
    from ragsieve import Sieve

    sieve = Sieve.load("embedded:default", llm=smollm2)
    decision = sieve.should_retrieve(QUESTIONS[0])
    if sieve.config.beta is None:  # fit found no skip that keeps accuracy: always retrieve
        assert decision.retrieve
    else:
        assert 0.0 <= decision.confidence <= 1.0 and decision.retrieve == (decision.confidence <= sieve.config.beta)
    kept = sieve.filter(QUESTIONS[0], DOCS)
    assert sorted(r.index for r in kept.ranked.results) == [0, 1, 2]
    assert len(kept.selected) == min(sieve.config.top_k, len(DOCS))
    assert len(kept.verdicts) == (len(kept.selected) if sieve.config.grader else 0)


def test_one_sieve_keeps_the_same_passages_through_python_http_and_langchain(tmp_path, tiny_llm):
    """The same fitted sieve, called in-process, over HTTP (/v1/filter) and as a LangChain compressor:
    one kept set, one set of scores (rerank → top_k → grade → keep, in one place)."""
    import httpx

    from ragsieve import Sieve
    from ragsieve.pipeline import SieveConfig
    from ragsieve.registry import new_grader
    from ragsieve.serve import ServeConfig, create_app
    from ragsieve.serve.runner import BackgroundServer

    query = "who wrote hamlet shakespeare"
    docs = [
        "Paris is the capital and largest city of France.",
        "Hamlet is a tragedy written by William Shakespeare around 1600.",
        "",
        "The quick brown fox jumps over the lazy dog.",
        "Shakespeare's Hamlet tells of Prince Hamlet of Denmark.",
    ]
    folder = tmp_path / "sieve"
    new_grader("ranker", base="bm25", threshold=0.1).save(folder / "grader")
    Sieve(SieveConfig(llm=tiny_llm.spec, reranker="bm25", grader="grader", top_k=3)).save(folder)

    python_sieve = Sieve.load(folder, llm=tiny_llm)
    python = python_sieve.filter(query, docs)
    expected = [(r.index, r.score) for r, _ in python.kept_results]
    assert len(python.selected) == 3 and python.graded_out == 1  # the cut and the grader both acted
    assert sorted(i for i, _ in expected) == [1, 4]

    with BackgroundServer(create_app(ServeConfig(sieve=str(folder)))) as server:
        r = httpx.post(f"{server.url}/v1/filter", json={"query": query, "documents": docs})
        raw = httpx.post(f"{server.url}/v1/filter", json={"query": query, "documents": docs, "raw_scores": True})
    assert r.status_code == 200 and raw.status_code == 200, r.text
    http = [(x["index"], x["relevance_score"]) for x in r.json()["results"]]
    assert [i for i, _ in http] == [i for i, _ in expected] and r.json()["dropped"] == len(docs) - len(expected)
    # over HTTP the [0, 1] values of Python's raw scores; raw_scores: true answers Python's very numbers
    unit = python_sieve.reranker.unit_scores([s for _, s in expected])
    assert [s for _, s in http] == pytest.approx(list(unit), abs=1e-6)
    assert [x["relevance_score"] for x in raw.json()["results"]] == pytest.approx([s for _, s in expected], abs=1e-6)
    assert raw.json()["threshold"] == python.threshold == 0.1

    pytest.importorskip("langchain_core")
    from langchain_core.documents import Document

    from ragsieve.integrations.langchain import RagsieveCompressor

    out = RagsieveCompressor(sieve=str(folder)).compress_documents(
        [Document(page_content=t, metadata={"n": i}) for i, t in enumerate(docs)], query
    )
    assert [d.metadata["n"] for d in out] == [i for i, _ in expected]
    assert [d.metadata["relevance_score"] for d in out] == pytest.approx([s for _, s in expected], abs=1e-6)
