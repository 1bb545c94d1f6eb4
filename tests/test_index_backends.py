"""`index` encodes on the fastest backend whose vectors match fp32 (issue #74): the stated tolerance, the default
and its fallback, the backend recorded in the index and used by every query path, and the reranker's cosine half
over the stored vectors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ragsieve.data.records import Passage
from ragsieve.errors import ModelNotAvailable
from ragsieve.models.encoder import INDEX_ENCODER_BACKENDS, INDEX_MIN_COSINE, INDEX_RECALL_TOLERANCE
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.retrieve import build_index, load_index
from tests.conftest import SHARED_DATA, requires_data

TEXTS = [
    "Alexander Fleming discovered penicillin in 1928 at St Mary's Hospital in London.",
    "Mount Everest is the highest mountain above sea level, in the Himalayas on the border of Nepal and China.",
    "Hamlet is a tragedy written by William Shakespeare around 1600.",
    "Plants turn light, water and carbon dioxide into sugar and oxygen: photosynthesis.",
    "The euro is the currency used by twenty member states of the European Union.",
    "Jupiter is the largest planet in the Solar System, a gas giant with dozens of moons.",
    "The Nile flows north through eleven countries into the Mediterranean Sea.",
    "Mitochondria make most of the cell's ATP through oxidative phosphorylation.",
    " ".join(["The Treaty of Westphalia ended the Thirty Years' War in 1648 and reshaped the balance of power in "
              "Europe, recognising the sovereignty of the German princes."] * 8),  # past 256 tokens: truncated
    "ok",
]
QUERIES = ["who discovered penicillin", "highest mountain", "who wrote hamlet", "largest planet", "river into the sea"]


@pytest.fixture
def spy_backends(monkeypatch):
    """Every (encoder spec, backend) the real :func:`load_backend_encoder` is asked for, in order."""
    import ragsieve.models.encoder as encoder_module

    calls: list[tuple[str, str]] = []
    real = encoder_module.load_backend_encoder

    def recording(spec=DEFAULT_ENCODER, backend="torch", threads=None, bulk=False):
        calls.append((spec, backend))
        return real(spec, backend, threads, bulk)

    monkeypatch.setattr(encoder_module, "load_backend_encoder", recording)
    return calls


def test_the_default_backend_follows_the_cpu_and_the_tolerance_rules_out_int8(monkeypatch, tmp_path):
    from ragsieve.models.cpu import fast_bf16
    from ragsieve.models.encoder import index_encoder_backend, resolve_encoder_path

    # an encoder the ONNX path cannot run (CLS pooling) falls back to torch, as does one that is no local folder
    minilm = Path(resolve_encoder_path(DEFAULT_ENCODER))
    cls_pooled = tmp_path / "cls-encoder"
    (cls_pooled / "1_Pooling").mkdir(parents=True)
    for name in ("modules.json", "tokenizer.json", "model.safetensors"):
        (cls_pooled / name).symlink_to(minilm / name)
    pooling = json.loads((minilm / "1_Pooling" / "config.json").read_text())
    (cls_pooled / "1_Pooling" / "config.json").write_text(json.dumps(
        {**pooling, "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True}))
    try:
        monkeypatch.setenv("RAGSIEVE_CPU_BF16", "1")
        fast_bf16.cache_clear()
        assert index_encoder_backend() == "openvino-bf16"
        assert index_encoder_backend(spec=str(cls_pooled)) == "torch"
        assert index_encoder_backend(spec="hf:some/remote-encoder") == "torch"
        monkeypatch.setenv("RAGSIEVE_CPU_BF16", "0")  # a CPU without bf16 units: torch fp32, as before #74
        fast_bf16.cache_clear()
        assert index_encoder_backend() == "torch"
        assert index_encoder_backend("torch-bf16") == "torch"  # bf16 emulated would be slower: fp32
        assert index_encoder_backend("openvino-bf16") == "openvino-bf16"  # OpenVINO runs it in f32 there
        assert index_encoder_backend("onnx") == "onnx"
    finally:
        monkeypatch.delenv("RAGSIEVE_CPU_BF16")
        fast_bf16.cache_clear()
    with pytest.raises(ModelNotAvailable, match="onnx-int8.*cannot build an index"):
        index_encoder_backend("onnx-int8")


@pytest.mark.integration
def test_every_index_backend_matches_fp32_within_the_stated_tolerance():
    """Per-vector cosine to torch fp32's vector of the same text >= INDEX_MIN_COSINE on every backend an index may
    use, through the path `index` encodes on; onnx-int8 misses it (why it may not build an index)."""
    from ragsieve.models.encoder import load_encoder, load_onnx_encoder
    from ragsieve.retrieve.dense import passage_vectors

    passages = [Passage(f"p{i}", t) for i, t in enumerate(TEXTS)]
    fp32 = load_encoder().encode(TEXTS, normalize_embeddings=True)
    for backend in INDEX_ENCODER_BACKENDS:
        vecs, truncated, _ = passage_vectors(passages, backend=backend, show_progress=False)
        cosines = (vecs * fp32).sum(1)
        assert cosines.min() >= INDEX_MIN_COSINE, (backend, cosines.min())
        assert truncated == 1, backend  # every backend reads the same 256-token window
    int8 = load_onnx_encoder(backend="onnx-int8").encode(TEXTS)
    assert (int8 * fp32).sum(1).min() < INDEX_MIN_COSINE


@requires_data
@pytest.mark.integration
def test_the_default_built_index_recalls_what_the_fp32_built_one_recalls():
    """Recall@10 of the gold paragraphs, by the index built on the default backend and by the fp32-built one, each
    queried on its own backend, on 200 HotpotQA paragraphs and the 20 questions they belong to: within
    INDEX_RECALL_TOLERANCE (bench/index.py measures it on thousands, with an interval by query)."""
    from ragsieve.benchmarks.mining import hotpot_1517
    from ragsieve.models.encoder import index_encoder_backend
    from ragsieve.retrieve.dense import DenseRetriever

    ds = hotpot_1517(SHARED_DATA)
    by_title = {p.id: p for p in ds.passages}
    questions = ds.questions[:20]
    passages = list({t: by_title[t] for q in questions for t in q.meta["candidate_ids"]}.values())
    fp32 = DenseRetriever.build(passages, encoder_backend="torch", show_progress=False)
    built = DenseRetriever.build(passages, show_progress=False)
    assert built.encoder_backend == index_encoder_backend()

    def recall(index: DenseRetriever) -> float:
        hits = index.search_batch([q.text for q in questions], k=10)
        return float(np.mean([len({h.passage.id for h in found} & set(q.gold_passage_ids)) / len(q.gold_passage_ids)
                              for q, found in zip(questions, hits)]))

    assert abs(recall(built) - recall(fp32)) <= INDEX_RECALL_TOLERANCE


@pytest.mark.integration
def test_queries_encode_on_the_backend_that_built_the_index_everywhere(tmp_path, cli, tiny_llm_dir, spy_backends):
    """An index built on `onnx` (not this machine's default) records it, and `retrieve`, `ask`, `serve --index`
    and `--add` all encode on it: the scores are the onnx query vectors' dot products with the stored ones."""
    import httpx

    from ragsieve.models.encoder import load_backend_encoder
    from ragsieve.serve import ServeConfig, create_app
    from ragsieve.serve.runner import BackgroundServer

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(TEXTS[:8])))
    out = tmp_path / "idx"
    r = cli("index", "--passages", corpus, "--out", out, "--kind", "dense", "--chunk-tokens", "0",
            "--encoder-backend", "onnx")
    assert r.code == 0, r.err
    assert "encoder on onnx" in r.err
    assert json.loads((out / "manifest.json").read_text())["encoder_backend"] == "onnx"
    assert json.loads((out / "dense" / "dense.json").read_text())["encoder_backend"] == "onnx"
    stored = np.load(out / "dense" / "embeddings.npy")

    spy_backends.clear()
    r = cli("retrieve", QUERIES[0], "--index", out, "-k", "3", "--json")
    assert r.code == 0, r.err
    top = json.loads(r.out.splitlines()[0])
    query = load_backend_encoder(DEFAULT_ENCODER, "onnx").encode([QUERIES[0]], normalize_embeddings=True)[0]
    assert top["id"] == "p0" and top["score"] == pytest.approx(float(stored[0] @ query), abs=1e-5)

    r = cli("ask", "Who discovered penicillin?", "--index", out, "--llm", tiny_llm_dir, "--top-k", "1",
            "--max-new-tokens", "2", "--show-contexts")
    assert r.code == 0, r.err
    config = ServeConfig(reranker="bm25", llm=str(tiny_llm_dir), index=str(out), max_new_tokens=2, max_wait_ms=30)
    with BackgroundServer(create_app(config)) as server:
        answer = httpx.post(f"{server.url}/v1/ask", json={"query": "Which planet is the largest?"}, timeout=120)
    assert answer.status_code == 200, answer.text
    assert "jupiter" in json.dumps(answer.json()["contexts"]).lower()

    more = tmp_path / "more.jsonl"
    more.write_text(json.dumps({"id": "p8", "text": TEXTS[6].replace("Nile", "Danube")}) + "\n")
    r = cli("index", "--add", "--passages", more, "--out", out, "--chunk-tokens", "0")
    assert r.code == 0, r.err
    assert json.loads((out / "manifest.json").read_text())["encoder_backend"] == "onnx"
    assert {backend for _, backend in spy_backends} == {"onnx"}, spy_backends
    assert len(spy_backends) >= 4  # retrieve, ask, serve and --add each loaded the encoder

    # an index from before #74 records no backend: torch fp32 built it, so queries encode there
    config_file = out / "dense" / "dense.json"
    config_file.write_text(json.dumps({k: v for k, v in json.loads(config_file.read_text()).items()
                                       if k != "encoder_backend"}))
    assert load_index(out).encoder_backend == "torch"


@pytest.mark.integration
def test_stored_vectors_feed_the_cosine_half_with_the_scores_of_today(tmp_path):
    """The shipped reranker's cosine half reads a hit's stored vector (it encodes none) and scores what encoding the
    passage on its own backend scores; against a torch-fp32-built index (every index before #74) it moves by no
    more than the tolerance allows."""
    from ragsieve.registry import load_reranker

    passages = [Passage(f"p{i}", t) for i, t in enumerate(TEXTS)]
    built = build_index(passages, tmp_path / "default", kind="dense", exact=True, show_progress=False)
    fp32_built = build_index(passages, tmp_path / "fp32", kind="dense", exact=True, encoder_backend="torch",
                             show_progress=False)
    cosine = load_reranker("embedded:base").cosine
    for query in QUERIES:
        hits = built.search(query, k=len(passages))
        order = [h.passage for h in hits]
        before = cosine.encoded_passages
        from_index = cosine.score(query, order)
        assert cosine.encoded_passages == before  # every vector came from the index
        fresh = load_reranker("embedded:base").cosine.score(query, [Passage(p.id, p.text) for p in order])
        same_backend = built.encoder_backend == cosine.backend
        np.testing.assert_allclose(from_index, fresh, atol=1e-5 if same_backend else 0.02)
        by_id = {h.passage.id: h.passage for h in fp32_built.search(query, k=len(passages))}
        today = cosine.score(query, [by_id[p.id] for p in order])
        # 1 - INDEX_MIN_COSINE bounds how far a unit vector moves; a dot product moves by at most its square root
        np.testing.assert_allclose(from_index, today, atol=np.sqrt(2 * (1 - INDEX_MIN_COSINE)))
