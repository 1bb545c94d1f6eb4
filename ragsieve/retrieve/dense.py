"""Dense retrieval: a sentence-transformers bi-encoder plus a faiss inner-product index.

Embeddings are L2-normalised, so inner product = cosine similarity. The default index is
HNSW (``faiss.IndexHNSWFlat``, ``METRIC_INNER_PRODUCT``); ``exact=True`` uses a brute-force
``faiss.IndexFlatIP`` instead (best for pools of a few thousand passages, or as ground truth).

HNSW defaults (``M=32, ef_construction=200, ef_search=64``) come from
``bench/retrieval.py`` on ~100k MiniLM vectors: see ``bench/results/retrieval.json``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

import numpy as np

from ragsieve.artifacts import INDEX_REBUILD, check_npy, damaged, read_json_artifact, reading_artifact
from ragsieve.data.records import Passage, with_stored_vector
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.retrieve.base import Hit, Retriever, _check_dir, _check_k, _load_passages, check_passages

if TYPE_CHECKING:
    import faiss
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

DEFAULT_M = 32
DEFAULT_EF_CONSTRUCTION = 200
DEFAULT_EF_SEARCH = 64
#: texts per encoder forward. 16 suits both index backends on 2 cores: 200-token HotpotQA chunks, OpenVINO bf16 on
#: 2 streams 71.6 chunks/s at 16 against 65.2 at 64; torch fp32 28.7 against 27.6
DEFAULT_BATCH_SIZE = 16

#: batches per encoder call in :func:`embed_texts`: enough that a stream idling after its last batch of a call costs
#: little (≈ half a batch in 32), few enough for a progress line every ≈ 7 s (512 chunks at 75 chunks/s)
BATCHES_PER_CALL = 32

_INDEX_FILE = "index.faiss"
_EMB_FILE = "embeddings.npy"
_CONFIG_FILE = "dense.json"


def count_truncated(encoder: "SentenceTransformer", texts: Sequence[str], chunk: int = 4096) -> int:
    """How many ``texts`` the encoder will truncate (token count incl. special tokens > ``max_seq_length``).

    Example::

        n = count_truncated(load_encoder(), [p.full_text for p in passages])
    """
    max_len = encoder.max_seq_length
    tokenizer = getattr(encoder, "tokenizer", None)
    if not max_len or tokenizer is None:
        return 0
    if not hasattr(tokenizer, "convert_ids_to_tokens"):  # an ONNX encoder's tokenizers.Tokenizer
        from ragsieve.models.onnx import fast_tokenizer

        tokenizer = fast_tokenizer(tokenizer)
    n = 0
    for start in range(0, len(texts), chunk):
        # verbose=False: we count the long ones ourselves instead of one tokenizer warning per call
        ids = tokenizer(list(texts[start : start + chunk]), add_special_tokens=True, truncation=False, verbose=False)
        n += sum(len(x) > max_len for x in ids["input_ids"])
    return n


def report_truncated(encoder: "SentenceTransformer", texts: Sequence[str]) -> int:
    """:func:`count_truncated`, with the warning every index build and add gives when it is not 0.

    Example::

        truncated = report_truncated(encoder, [p.full_text for p in passages])
    """
    truncated = count_truncated(encoder, texts)
    warn_truncated(truncated, len(texts), f"{encoder.max_seq_length} tokens")
    return truncated


def warn_truncated(truncated: int, n: int, window: str) -> None:
    """The one warning about passages longer than the encoder's window (``window``: how long it is)."""
    if truncated:
        log.warning("%d of %d passages are longer than the encoder's max_seq_length (%s) and were truncated",
                    truncated, n, window)


def embed_texts(
    encoder: "SentenceTransformer",
    texts: Sequence[str],
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    show_progress: bool = True,
    description: str = "embedding",
    backend: str = "torch",
) -> np.ndarray:
    """Encode ``texts`` to L2-normalised float32 vectors ``(len(texts), dim)``, with progress on stderr.

    Texts are encoded longest-first in batches of ``batch_size`` (less padding per batch), handed to the encoder
    :data:`BATCHES_PER_CALL` batches at a time (an OpenVINO encoder compiled for throughput runs them side by
    side), and returned in input order; ``backend`` is the encoder's (``torch-bf16`` runs under bf16 autocast).

    Example::

        vecs = embed_texts(load_encoder(), ["a passage", "another"], show_progress=False)
    """
    if batch_size <= 0:
        raise RagsieveError(f"batch_size must be positive, got {batch_size}")
    from ragsieve.models.cpu import autocast

    n = len(texts)
    dim = _encoder_dim(encoder)
    out = np.empty((n, dim), dtype=np.float32)
    order = sorted(range(n), key=lambda i: -len(texts[i]))

    def encode_all(advance: Any) -> None:
        for start in range(0, n, batch_size * BATCHES_PER_CALL):
            idx = order[start : start + batch_size * BATCHES_PER_CALL]
            with autocast(backend):
                vecs = encoder.encode([texts[i] for i in idx], batch_size=batch_size, normalize_embeddings=True,
                                      convert_to_numpy=True, show_progress_bar=False)
            out[idx] = np.asarray(vecs, dtype=np.float32)
            advance(len(idx))

    if show_progress and n:
        from ragsieve.progress import progress_bar

        with progress_bar() as progress:  # stderr: a bar on a terminal, plain lines in a log
            task = progress.add_task(description, total=n)
            encode_all(lambda m: progress.advance(task, m))
    else:
        encode_all(lambda m: None)
    return out


def _encoder_dim(encoder: "SentenceTransformer") -> int:
    get_dim = getattr(encoder, "get_embedding_dimension", None) or encoder.get_sentence_embedding_dimension
    dim = get_dim()
    if not dim:
        raise RagsieveError("encoder does not report an embedding dimension")
    return int(dim)


def load_index_encoder(encoder_spec: str, dim: int, backend: str = "torch") -> "SentenceTransformer":
    """Load the bi-encoder an index was built with, on ``backend`` (:func:`query_backend`: the one that built it,
    as this process can run it), refusing one whose vectors are not ``dim``-d.

    Example::

        encoder = load_index_encoder("embedded:all-minilm-l6-v2", 384, "openvino-bf16")
    """
    from ragsieve.models.encoder import load_backend_encoder

    encoder = load_backend_encoder(encoder_spec, backend)
    if _encoder_dim(encoder) != dim:
        raise RagsieveError(
            f"encoder '{encoder_spec}' gives {_encoder_dim(encoder)}-d vectors "
            f"but the index holds {dim}-d vectors; use the encoder the index was built with"
        )
    return encoder


def query_backend(index_backend: str) -> str:
    """The backend queries of an index built on ``index_backend`` encode on: the same, or where this process cannot
    run it, its fallback (:func:`ragsieve.models.cpu.cpu_backend`; vectors within the index tolerance either way)."""
    from ragsieve.models.cpu import cpu_backend

    return cpu_backend(index_backend)


def encode_queries(
    encoder: "SentenceTransformer", queries: Sequence[str], *, batch_size: int = DEFAULT_BATCH_SIZE,
    backend: str = "torch",
) -> np.ndarray:
    """Normalised float32 query vectors ``(len(queries), dim)``, in one batched encoder call on ``backend``.

    Example::

        q = encode_queries(load_encoder(), ["who wrote Hamlet"])
    """
    from ragsieve.models.cpu import autocast

    with autocast(backend):
        vecs = encoder.encode(list(queries), batch_size=batch_size, normalize_embeddings=True,
                              convert_to_numpy=True, show_progress_bar=False)
    return np.ascontiguousarray(vecs, dtype=np.float32)


def normalise_rows(x: np.ndarray) -> np.ndarray:
    """``x`` as float32 rows of unit length; non-finite or zero rows raise.

    Example::

        normalise_rows(np.array([[3.0, 4.0]]))  # [[0.6, 0.8]]
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if not np.all(np.isfinite(x)) or np.any(norms == 0):
        raise RagsieveError("embeddings must be finite and non-zero")
    return x / norms


def build_backend(requested: str | None, encoder: Any = None, embeddings: "np.ndarray | None" = None,
                  spec: str = DEFAULT_ENCODER) -> str:
    """The encoder backend an index build records and encodes on: ``requested`` as given for injected
    ``embeddings`` (the caller knows what made them), else :func:`ragsieve.models.encoder.index_encoder_backend`
    of ``requested`` or of a given ``encoder``'s own backend (torch for a ``SentenceTransformer``)."""
    from ragsieve.models.encoder import index_encoder_backend

    if embeddings is not None and requested:
        return requested
    return index_encoder_backend(requested or (getattr(encoder, "backend", "torch") if encoder is not None else None),
                                 spec)


def passage_vectors(
    passages: Sequence[Passage],
    embeddings: "np.ndarray | None" = None,
    *,
    encoder: "SentenceTransformer | None" = None,
    encoder_spec: str = DEFAULT_ENCODER,
    backend: str = "torch",
    batch_size: int = DEFAULT_BATCH_SIZE,
    show_progress: bool | None = None,
) -> tuple[np.ndarray, int | None, "SentenceTransformer | None"]:
    """(unit rows, how many texts were truncated or None if unknown, the encoder used) for ``passages``:
    encoded on ``backend`` with ``encoder`` (loaded from ``encoder_spec`` if None), or ``embeddings`` checked and
    normalised (on Ray actors: :func:`ragsieve.retrieve.scale.ray_vectors`).

    Example::

        vecs, truncated, encoder = passage_vectors([Passage(id="p1", text="Paris is in France.")])
    """
    if embeddings is not None:
        vecs = np.asarray(embeddings)
        if vecs.ndim != 2 or vecs.shape[0] != len(passages):
            raise RagsieveError(f"embeddings have shape {vecs.shape}; expected ({len(passages)}, dim)")
        return normalise_rows(vecs), None, encoder
    texts = [p.full_text for p in passages]
    if encoder is None:
        from ragsieve.models.encoder import load_backend_encoder

        encoder = load_backend_encoder(encoder_spec, backend, bulk=True)
    truncated = report_truncated(encoder, texts)
    vecs = embed_texts(encoder, texts, batch_size=batch_size, show_progress=show_progress, backend=backend)
    return vecs, truncated, encoder


def make_faiss_index(
    embeddings: np.ndarray,
    *,
    exact: bool = False,
    m: int = DEFAULT_M,
    ef_construction: int = DEFAULT_EF_CONSTRUCTION,
    ef_search: int = DEFAULT_EF_SEARCH,
) -> "faiss.Index":
    """Build an inner-product faiss index over (already normalised) ``embeddings``.

    Example::

        index = make_faiss_index(vecs, exact=False, m=32, ef_construction=200, ef_search=64)
    """
    import faiss

    dim = embeddings.shape[1]
    if exact:
        index = faiss.IndexFlatIP(dim)
    else:
        index = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = ef_construction
        index.hnsw.efSearch = ef_search
    index.add(np.ascontiguousarray(embeddings, dtype=np.float32))
    return index


class DenseRetriever(Retriever):
    """Bi-encoder retrieval over a faiss index (cosine similarity via inner product).

    Build with :meth:`build`; the encoder is named by a spec string (default the embedded
    all-MiniLM-L6-v2, or an HF id / local folder) and loaded only when text is encoded, so a
    loaded index with injected vectors costs nothing until the first query.

    ``truncated_count`` is the number of passages longer than the encoder's ``max_seq_length``
    (those are embedded from their first tokens only); ``None`` when embeddings were injected.

    Example::

        dense = DenseRetriever.build(passages, exact=True, show_progress=False)
        dense.search("who discovered penicillin", k=5)
    """

    kind = "dense"
    subdir = "dense"
    uses_encoder = True

    def __init__(
        self,
        passages: Sequence[Passage],
        index: "faiss.Index",
        embeddings: np.ndarray,
        *,
        encoder_spec: str = DEFAULT_ENCODER,
        encoder: "SentenceTransformer | None" = None,
        exact: bool = False,
        m: int = DEFAULT_M,
        ef_construction: int = DEFAULT_EF_CONSTRUCTION,
        truncated_count: int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        encoder_backend: str = "torch",
    ) -> None:
        super().__init__(passages)
        if index.ntotal != len(self.passages) or embeddings.shape[0] != len(self.passages):
            raise RagsieveError(
                f"dense index holds {index.ntotal} vectors / {embeddings.shape[0]} embeddings "
                f"for {len(self.passages)} passages; {INDEX_REBUILD}"
            )
        self.index = index
        self.embeddings = embeddings
        self.encoder_spec = encoder_spec
        self.encoder_backend = encoder_backend  # what built the vectors; queries are encoded on it too
        self._encoder = encoder
        self.exact = exact
        self.m = m
        self.ef_construction = ef_construction
        self.truncated_count = truncated_count
        self.batch_size = batch_size

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        passages: Iterable[Passage],
        *,
        encoder_spec: str = DEFAULT_ENCODER,
        encoder: "SentenceTransformer | None" = None,
        embeddings: np.ndarray | None = None,
        exact: bool = False,
        m: int = DEFAULT_M,
        ef_construction: int = DEFAULT_EF_CONSTRUCTION,
        ef_search: int = DEFAULT_EF_SEARCH,
        batch_size: int = DEFAULT_BATCH_SIZE,
        show_progress: bool = True,
        truncated_count: int | None = None,
        encoder_backend: str | None = None,
    ) -> "DenseRetriever":
        """Embed ``passages`` (``full_text``) and index them.

        Inputs: ``encoder_spec`` (spec string saved with the index) or an already loaded
        ``encoder`` (its spec is still what gets saved); ``encoder_backend`` (saved too: queries encode on it)
        defaults to :func:`ragsieve.models.encoder.index_encoder_backend`'s choice, or a given encoder's own;
        ``embeddings`` ``(n, dim)`` skips
        encoding (rows are re-normalised), and ``truncated_count`` then says how many of them
        were encoded from truncated text, if the caller knows; ``exact`` picks ``IndexFlatIP`` over HNSW;
        ``m`` / ``ef_construction`` / ``ef_search`` tune HNSW; ``batch_size`` and
        ``show_progress`` control encoding (on Ray actors: ``build_index(..., ray="local")``).

        Example::

            dense = DenseRetriever.build(passages, embeddings=vecs, exact=True)
        """
        passages = check_passages(passages)
        backend = build_backend(encoder_backend, encoder, embeddings, encoder_spec)
        vecs, truncated, encoder = passage_vectors(passages, embeddings, encoder=encoder, encoder_spec=encoder_spec,
                                                   backend=backend, batch_size=batch_size, show_progress=show_progress)
        if embeddings is not None:
            truncated = truncated_count  # the caller's encoding: only it knows
        index = make_faiss_index(vecs, exact=exact, m=m, ef_construction=ef_construction, ef_search=ef_search)
        return cls(
            passages,
            index,
            vecs,
            encoder_spec=encoder_spec,
            encoder=encoder,
            exact=exact,
            m=m,
            ef_construction=ef_construction,
            truncated_count=truncated,
            batch_size=batch_size,
            encoder_backend=backend,
        )

    # -- encoder ----------------------------------------------------------------------------
    @property
    def encoder(self) -> "SentenceTransformer":
        """The bi-encoder, loaded from ``encoder_spec`` on first use."""
        if self._encoder is None:
            self._encoder = load_index_encoder(self.encoder_spec, self.dim, self.query_backend)
        return self._encoder

    @property
    def query_backend(self) -> str:
        """The backend queries encode on: the index's own (:func:`query_backend`)."""
        return query_backend(self.encoder_backend)

    @property
    def dim(self) -> int:
        return int(self.index.d)

    @property
    def ef_search(self) -> int | None:
        """HNSW search breadth (higher = better recall, slower); ``None`` for an exact index."""
        return None if self.exact else int(self.index.hnsw.efSearch)

    @ef_search.setter
    def ef_search(self, value: int) -> None:
        if self.exact:
            raise RagsieveError("ef_search only applies to an HNSW index (exact=False)")
        self.index.hnsw.efSearch = int(value)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Normalised float32 query vectors ``(len(queries), dim)``.

        Example::

            q = dense.encode_queries(["who wrote Hamlet"])
        """
        return encode_queries(self.encoder, queries, batch_size=self.batch_size, backend=self.query_backend)

    # -- search -----------------------------------------------------------------------------
    def search_vectors(self, vectors: np.ndarray, k: int = 10) -> list[list[Hit]]:
        """Search with precomputed query vectors ``(n, dim)`` (normalised here).

        Example::

            dense.search_vectors(dense.embeddings[:2], k=3)
        """
        vectors = normalise_rows(np.atleast_2d(np.asarray(vectors)))
        if vectors.shape[1] != self.dim:
            raise RagsieveError(f"query vectors are {vectors.shape[1]}-d; the index is {self.dim}-d")
        k = min(_check_k(k), len(self))
        scores, ids = self.index.search(vectors, k)
        out = []
        for row_s, row_i in zip(scores, ids):
            keep = row_i >= 0  # faiss pads with -1 when it finds fewer than k
            out.append(self._hits(row_i[keep], row_s[keep]))
        return out

    def _search(self, query: str, k: int) -> list[Hit]:
        return self._search_batch([query], k)[0]

    def _search_batch(self, queries: list[str], k: int) -> list[list[Hit]]:
        return self.search_vectors(self.encode_queries(queries), k)

    def _hits(self, indices, scores) -> list[Hit]:
        """Hits whose passages carry their stored vector, so a reranker's cosine half need not encode them."""
        return [Hit(with_stored_vector(self._passages[int(i)], self.embeddings[int(i)], self.encoder_spec),
                    float(s), r) for r, (i, s) in enumerate(zip(indices, scores))]

    def attach_vectors(self, hits: Sequence[Hit]) -> list[Hit]:
        """``hits`` of another retriever over the same passages, each passage carrying its vector from this index."""
        if not hasattr(self, "_row_of"):
            self._row_of = {p.id: i for i, p in enumerate(self._passages)}
        out = []
        for h in hits:
            row = self._row_of.get(h.passage.id)
            passage = h.passage if row is None else with_stored_vector(h.passage, self.embeddings[row],
                                                                       self.encoder_spec)
            out.append(Hit(passage, h.score, h.rank))
        return out

    # -- persistence ------------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The settings saved next to the index (JSON-able)."""
        return {
            "encoder": self.encoder_spec,
            "encoder_backend": self.encoder_backend,
            "exact": self.exact,
            "m": self.m,
            "ef_construction": self.ef_construction,
            "ef_search": self.ef_search,
            "dim": self.dim,
            "n_passages": len(self),
            "truncated_count": self.truncated_count,
            "batch_size": self.batch_size,
        }

    def save(self, path: str | Path, *, with_passages: bool = True) -> None:
        """Write ``index.faiss``, ``embeddings.npy``, ``dense.json`` (encoder spec, settings) and passages.

        Example::

            dense.save("my_index/dense")
        """
        import faiss

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self.index, str(path / _INDEX_FILE))
        np.save(path / _EMB_FILE, self.embeddings)
        (path / _CONFIG_FILE).write_text(json.dumps(self.config(), indent=2))
        self._save_passages(path, with_passages)

    @classmethod
    def load(cls, path: str | Path, *, passages: Sequence[Passage] | None = None) -> "DenseRetriever":
        """Load a folder written by :meth:`save`; the encoder loads lazily on the first text query.

        Example::

            dense = DenseRetriever.load("my_index/dense")
        """
        import faiss

        path = _check_dir(path, cls.kind, _INDEX_FILE, _EMB_FILE, _CONFIG_FILE)
        cfg = read_json_artifact(path / _CONFIG_FILE, INDEX_REBUILD)
        unreadable = "faiss cannot read it: truncated or not a faiss index"  # faiss's own is a C++ assertion
        with reading_artifact(path / _INDEX_FILE, INDEX_REBUILD, unreadable):
            index = faiss.read_index(str(path / _INDEX_FILE))
        check_npy(path / _EMB_FILE, INDEX_REBUILD)
        with reading_artifact(path / _EMB_FILE, INDEX_REBUILD):
            embeddings = np.load(path / _EMB_FILE)
        with reading_artifact(path / _CONFIG_FILE, INDEX_REBUILD):
            settings = dict(
                encoder_spec=str(cfg["encoder"]),
                exact=bool(cfg["exact"]),
                m=int(cfg.get("m", DEFAULT_M)),
                ef_construction=int(cfg.get("ef_construction", DEFAULT_EF_CONSTRUCTION)),
                truncated_count=cfg.get("truncated_count"),
                batch_size=int(cfg.get("batch_size", DEFAULT_BATCH_SIZE)),
                encoder_backend=str(cfg.get("encoder_backend", "torch")),  # indexes before #74: torch built them
            )
        if embeddings.ndim != 2 or embeddings.shape[1:] != (index.d,):
            raise damaged(path / _EMB_FILE, f"shape {embeddings.shape} does not fit a {index.d}-d index", INDEX_REBUILD)
        return cls(_load_passages(path, passages), index, embeddings, **settings)
