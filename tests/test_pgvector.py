"""A dense index in a real PostgreSQL with pgvector: `index --store`, `retrieve`, `ask`, serve's /v1/ask,
HNSW recall against the same table's exact search, and one-line errors for a bad URL or a missing extension.

The server is the pgvector-enabled build that ``make install`` brings (``tools/postgres.py``), started once
for this module in a temporary folder on a free loopback port.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.retrieve import PgVectorRetriever, add_to_index, build_index, load_index

# a corpus of our own: one unmistakable answer per question
DOCS = [
    {"id": "penicillin", "title": "Penicillin", "text": "Alexander Fleming discovered penicillin in 1928 at St Mary's."},
    {"id": "everest", "title": "Mount Everest", "text": "Everest is the highest mountain above sea level, in the Himalayas."},
    {"id": "hamlet", "title": "Hamlet", "text": "Hamlet is a tragedy written by William Shakespeare around 1600."},
    {"id": "photosynthesis", "title": "Photosynthesis", "text": "Plants turn light, water and carbon dioxide into sugar."},
    {"id": "euro", "title": "Euro", "text": "The euro is the currency used by twenty member states of the European Union."},
    {"id": "jupiter", "title": "Jupiter", "text": "Jupiter is the largest planet in the Solar System, a gas giant."},
]


@pytest.fixture
def pg(postgres):
    """The session's one PostgreSQL (tests/conftest.py), shared with the feedback store's tests."""
    return postgres


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    return path


def _one_line_error(r, *fragments: str) -> None:
    assert r.code == 2, (r.out, r.err)
    err = r.err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    for fragment in fragments:
        assert fragment in err, err


@pytest.mark.integration
def test_index_store_then_retrieve_ask_and_add(pg, corpus, tmp_path, cli, tiny_llm_dir):
    """`index --passages --store` writes MiniLM vectors into pgvector; `retrieve` and `ask` read them back."""
    url = pg.url(table="mine")
    r = cli("index", "--passages", corpus, "--store", url, "--chunk-tokens", "0")
    assert r.code == 0, r.err
    assert "indexed 6 passages" in r.out and "table mine" in r.out

    r = cli("retrieve", "who discovered penicillin", "--index", url, "-k", "3", "--json")
    assert r.code == 0, r.err
    rows = [json.loads(line) for line in r.out.splitlines()]
    assert [row["rank"] for row in rows] == [0, 1, 2] and rows[0]["id"] == "penicillin"

    # the same embedder as a folder's dense index: the same ranking, the same cosine scores
    passages = [Passage(d["id"], d["text"], d["title"]) for d in DOCS]
    folder = build_index(passages, tmp_path / "dense", kind="dense", exact=True, show_progress=False)
    for query in ("highest mountain", "who wrote Hamlet", "which currency"):
        want, got = folder.search(query, k=6), load_index(url).search(query, k=6)
        assert [h.passage.id for h in got] == [h.passage.id for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)

    r = cli("ask", "Who discovered penicillin?", "--index", url, "--llm", tiny_llm_dir, "--top-k", "1",
            "--max-new-tokens", "2", "--show-contexts")
    assert r.code == 0, r.err
    assert "penicillin" in r.out

    new = tmp_path / "more.jsonl"
    new.write_text(json.dumps({"id": "nile", "title": "Nile", "text": "The Nile flows north into the Mediterranean."}) + "\n")
    r = cli("index", "--add", "--passages", new, "--store", url, "--chunk-tokens", "0")
    assert r.code == 0, r.err
    retriever = load_index(url)
    assert len(retriever) == 7 and retriever.search("river flowing into the Mediterranean", k=1)[0].passage.id == "nile"
    _one_line_error(cli("index", "--add", "--passages", new, "--store", url, "--chunk-tokens", "0"),
                    "passage id 'nile' is already in the index")
    _one_line_error(cli("index", "--passages", corpus, "--store", url, "--chunk-tokens", "0"),
                    "already holds an index", "--overwrite")


@pytest.mark.integration
def test_add_counts_the_truncated_new_passages(pg, tmp_path, cli):
    """`index --add` adds its truncated passages (longer than MiniLM's 256 tokens) to the index's recorded
    count, as a build records them, instead of keeping the count of the first build."""
    url = pg.url(table="truncation")
    long = " ".join(["penicillin"] * 600)
    first, more = tmp_path / "first.jsonl", tmp_path / "more.jsonl"
    first.write_text("".join(json.dumps(d) + "\n" for d in [*DOCS, {"id": "long0", "text": long}]))
    more.write_text("".join(json.dumps(d) + "\n" for d in [{"id": "long1", "text": long}, {"id": "short", "text": "A short one."},
                                                             {"id": "long2", "text": long}]))
    assert cli("index", "--passages", first, "--store", url, "--chunk-tokens", "0").code == 0
    assert load_index(url).truncated_count == 1
    r = cli("index", "--add", "--passages", more, "--store", url, "--chunk-tokens", "0")
    assert r.code == 0, r.err
    retriever = load_index(url)
    assert len(retriever) == 10 and retriever.truncated_count == 3


@pytest.mark.integration
def test_serve_ask_retrieves_from_the_database(pg, tiny_llm_dir):
    import httpx

    from ragsieve.serve import ServeConfig, create_app
    from ragsieve.serve.runner import BackgroundServer

    url = pg.url(table="served")
    build_index([Passage(d["id"], d["text"], d["title"]) for d in DOCS], url, kind="dense", show_progress=False)
    config = ServeConfig(reranker="bm25", llm=str(tiny_llm_dir), index=url, max_new_tokens=2, max_wait_ms=30)
    with BackgroundServer(create_app(config)) as server:
        r = httpx.post(f"{server.url}/v1/ask", json={"query": "Which planet is the largest?"}, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["retrieved"] is True and "jupiter" in json.dumps(data["contexts"]).lower()


def test_hnsw_recall_against_exact_search(pg):
    """Recall@10 of the HNSW scan against the same table scanned in full.

    Random directions in 384-d, the hard case for a graph (true neighbours are nearly as far as
    the rest). Exact search here must agree with faiss's flat index, and HNSW (m=32,
    ef_construction=200, ef_search=64, the faiss defaults) must find nearly all of the true top 10.
    """
    import faiss

    rng = np.random.default_rng(0)
    vecs = rng.standard_normal((2000, 384)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    queries = rng.standard_normal((100, 384)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    passages = [Passage(f"p{i}", f"passage {i}") for i in range(len(vecs))]

    url = pg.url(table="recall")
    retriever = build_index(passages, url, kind="dense", embeddings=vecs, show_progress=False)
    hnsw = [[int(h.passage.id[1:]) for h in hits] for hits in retriever.search_vectors(queries, k=10)]
    exact = [[int(h.passage.id[1:]) for h in hits] for hits in retriever.search_vectors(queries, k=10, exact=True)]
    flat = faiss.IndexFlatIP(vecs.shape[1])
    flat.add(vecs)
    truth = flat.search(queries, 10)[1]
    assert np.mean([len(set(e) & set(t)) / 10 for e, t in zip(exact, truth)]) >= 0.99  # float ties aside
    per_query = [len(set(h) & set(e)) / 10 for h, e in zip(hnsw, exact)]
    assert np.mean(per_query) >= 0.95, np.mean(per_query)
    # the graph is searched, not the table (the planner would scan a table this small in full)
    retriever.ef_search = 10
    narrow = [[int(h.passage.id[1:]) for h in hits] for hits in retriever.search_vectors(queries, k=10)]
    assert np.mean([len(set(n) & set(e)) / 10 for n, e in zip(narrow, exact)]) < 0.9
    retriever.ef_search = 64

    # k above ef_search still returns k rows (ef_search is raised to k for that query)
    assert len(retriever.search_vectors(queries[:1], k=150)[0]) == 150
    # a dropped connection (a restarted server, an idle timeout) costs the next search nothing
    pg.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'postgres' "
               "AND pid <> pg_backend_pid() AND backend_type = 'client backend'")
    assert len(retriever.search_vectors(queries[:1], k=10)[0]) == 10
    # a retriever crosses processes (Ray workers) without its connection, and reconnects
    again = pickle.loads(pickle.dumps(retriever))
    assert [h.passage.id for h in again.search_vectors(queries[:1], k=5)[0]] == [f"p{i}" for i in hnsw[0][:5]]
    assert isinstance(load_index(url), PgVectorRetriever) and len(load_index(url).passages) == 2000


def test_index_url_parsing_keeps_libpq_parameters_and_no_password_in_messages():
    from ragsieve.retrieve.pgvector import StoreURL, is_store_url

    url = StoreURL.parse("postgresql://me:s3cret@db:5433/rag?sslmode=disable&table=docs")
    assert (url.conninfo, url.table, url.where) == ("postgresql://me:s3cret@db:5433/rag?sslmode=disable", "docs",
                                                   "db:5433/rag table docs")
    local = StoreURL.parse("postgresql:///rag")  # no host: libpq's socket; urllib would lose a slash here
    assert (local.conninfo, local.table) == ("postgresql:///rag", "ragsieve_passages")
    assert StoreURL.parse("postgres://me@/rag?host=/run/pg").server == "/run/pg:5432/rag"
    assert is_store_url("postgresql://x") and is_store_url("postgres://x") and not is_store_url("index/nq")
    with pytest.raises(RagsieveError, match="table name ''"):
        StoreURL.parse("postgresql://me@db/rag?table=")


def test_bad_url_and_missing_extension_are_one_line(pg, corpus, cli):
    _one_line_error(cli("retrieve", "q", "--index", "postgresql://postgres@127.0.0.1:1/none"),
                    "cannot connect to PostgreSQL at 127.0.0.1:1/none")
    _one_line_error(cli("retrieve", "q", "--index", pg.url(table="Bad-Name")), "table name 'Bad-Name'")
    _one_line_error(cli("retrieve", "q", "--index", pg.url(table="never_built")), "no ragsieve index there")
    _one_line_error(cli("index", "--passages", corpus, "--store", "mysql://x/y"), "expected a postgresql://")
    _one_line_error(cli("index", "--passages", corpus, "--store", pg.url(), "--kind", "hybrid"), "dense index only")
    _one_line_error(cli("index", "--passages", corpus), "give --out DIR")

    # a database without the extension, and a user who may not create it
    pg.execute("CREATE DATABASE plain_db")
    pg.execute("CREATE ROLE plain_user LOGIN")
    _one_line_error(cli("retrieve", "q", "--index", pg.url("plain_db")), "has no vector extension (pgvector)")
    _one_line_error(cli("index", "--passages", corpus, "--chunk-tokens", "0", "--store", pg.url("plain_db", "plain_user")),
                    "cannot create the vector extension", 'permission denied to create extension "vector"')
    # someone else's table of that name is never dropped, not even with --overwrite
    pg.execute("CREATE TABLE theirs (x int)")
    with pytest.raises(RagsieveError, match="not a ragsieve index"):
        build_index([Passage("a", "x")], pg.url(table="theirs"), kind="dense", embeddings=np.ones((1, 4)),
                    overwrite=True)


@pytest.mark.integration
def test_the_store_records_its_encoder_backend_queries_on_it_and_ray_builds_it_alike(pg):
    """A pgvector index records the backend that encoded it (issue #74); queries and `--add` encode on it; the same
    build on a local Ray (`index --store URL --ray local`) writes the same rows."""
    ray = pytest.importorskip("ray")
    from ragsieve.models.encoder import load_backend_encoder
    from ragsieve.models.specs import DEFAULT_ENCODER

    passages = [Passage(d["id"], d["text"], d["title"]) for d in DOCS]
    url = pg.url(table="onnx_built")
    build_index(passages[:5], url, kind="dense", encoder_backend="onnx", show_progress=False)
    retriever = load_index(url)
    assert retriever.manifest["encoder_backend"] == "onnx" and retriever.query_backend == "onnx"
    query = load_backend_encoder(DEFAULT_ENCODER, "onnx").encode(["who wrote Hamlet"], normalize_embeddings=True)
    hit = retriever.search("who wrote Hamlet", k=1)[0]
    assert hit.passage.id == "hamlet"
    assert hit.score == pytest.approx(float(np.asarray(hit.passage.meta["stored_vector"]) @ query[0]), abs=1e-5)
    added = add_to_index(url, passages[5:])
    assert added.manifest["encoder_backend"] == "onnx" and len(load_index(url)) == 6

    try:
        on_ray = build_index(passages, pg.url(table="on_ray"), kind="dense", encoder_backend="onnx", ray="local",
                             ray_shard_size=2, show_progress=False)
    finally:
        ray.shutdown()
    assert on_ray.manifest["encoder_backend"] == "onnx" and "ray" not in on_ray.manifest["options"]
    for query_text in ("highest mountain", "which currency", "largest planet"):
        want, got = load_index(url).search(query_text, k=6), load_index(pg.url(table="on_ray")).search(query_text, k=6)
        assert [h.passage.id for h in got] == [h.passage.id for h in want]
        assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)
