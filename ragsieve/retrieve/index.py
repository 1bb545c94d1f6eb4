"""Build and load on-disk indexes.

An index directory looks like::

    my_index/
      manifest.json     {format_version, kind, encoder, n_passages, created, options}
      passages.jsonl    the passages, once, shared by every part
      bm25/             bm25s files            (kind "bm25" or "hybrid")
      dense/            faiss index + vectors  (kind "dense" or "hybrid")
      hybrid.json       RRF settings           (kind "hybrid")

:func:`build_index` writes everything into a hidden temporary folder next to ``out_dir``
and renames it into place only when complete (:func:`ragsieve.atomic.atomic_directory`),
so an interrupted build never leaves a half-written index behind, and the next build
removes what a killed one left; ``manifest.json`` is the last file written.

An index spec is a folder or a ``postgresql://`` URL (a dense index in a pgvector table,
:mod:`ragsieve.retrieve.pgvector`); :func:`build_index`, :func:`add_to_index` and
:func:`load_index` take either, so every command that takes an index takes both.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from ragsieve.artifacts import INDEX_REBUILD, read_json_artifact
from ragsieve.atomic import atomic_directory
from ragsieve.data.records import Passage
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.retrieve.base import PASSAGES_FILE, Retriever, check_passages, read_passages, write_passages
from ragsieve.retrieve.bm25 import BM25Retriever
from ragsieve.retrieve.dense import DenseRetriever
from ragsieve.retrieve.hybrid import HybridRetriever
from ragsieve.retrieve.pgvector import add_to_store_index, build_store_index, is_store_url, load_store_index
from ragsieve.retrieve.scale import drop_ray_work, new_vectors, ray_vectors

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
#: how to replace an existing index, for callers of the CLI and of the library alike
OVERWRITE_HINT = "use --overwrite (overwrite=True in Python) or pick another folder"

#: kind name -> retriever class; adding a retriever kind means adding a row here
RETRIEVER_KINDS: dict[str, type[Retriever]] = {
    cls.kind: cls for cls in (BM25Retriever, DenseRetriever, HybridRetriever)
}


def _retriever_class(kind: str) -> type[Retriever]:
    try:
        return RETRIEVER_KINDS[kind]
    except (KeyError, TypeError):
        raise RagsieveError(f"unknown index kind {kind!r}; known: {', '.join(sorted(RETRIEVER_KINDS))}") from None


def _part_dir(root: Path, cls: type[Retriever]) -> Path:
    return root / cls.subdir if cls.subdir else root


def _jsonable_options(options: dict[str, Any]) -> dict[str, Any]:
    """Options for the manifest: plain values as-is, arrays / objects only as a marker."""
    out: dict[str, Any] = {}
    for key, value in sorted(options.items()):
        try:
            json.dumps(value)
            out[key] = value
        except TypeError:
            out[key] = f"<{type(value).__name__} provided>"
    return out


def build_index(
    passages: Iterable[Passage],
    out_dir: str | Path,
    kind: str = "hybrid",
    encoder_spec: str = DEFAULT_ENCODER,
    *,
    overwrite: bool = False,
    **options: Any,
) -> Retriever:
    """Build a ``kind`` index over ``passages`` and write it atomically to ``out_dir``.

    ``out_dir`` may be a ``postgresql://`` URL instead of a folder: a dense index in a
    pgvector table (:func:`ragsieve.retrieve.pgvector.build_store_index`).

    Inputs: ``kind`` is ``"hybrid"``, ``"bm25"`` or ``"dense"``; ``encoder_spec`` names the
    bi-encoder (ignored for ``"bm25"``); ``overwrite`` replaces an existing ``out_dir``;
    ``options`` go to the retriever's ``build`` (e.g. ``exact=True``, ``m=32``,
    ``ef_search=64``, ``batch_size=16``, ``show_progress=False``, ``embeddings=vecs``,
    ``k1``/``b`` for BM25, ``rrf_k``/``depth`` for hybrid, ``encoder_backend="openvino-bf16"``, ``ray="local"``:
    :meth:`DenseRetriever.build`). Duplicate passage ids raise.

    Example::

        retriever = build_index(dataset.passages, "indexes/nq", kind="hybrid", show_progress=False)
        retriever.search("who got the first nobel prize in physics", k=10)
    """
    if is_store_url(out_dir):
        return build_store_index(passages, str(out_dir), kind, encoder_spec, overwrite=overwrite, **options)
    cls = _retriever_class(kind)
    out = Path(out_dir)
    if out.exists() and not overwrite:  # before the (long) build, not after it
        raise RagsieveError(f"{out} already exists; {OVERWRITE_HINT}")
    passages = check_passages(passages)
    if cls.uses_encoder:
        options = {"encoder_spec": encoder_spec, **options}
    recorded = {k: v for k, v in options.items() if k not in ("encoder_spec", "truncated_count", *_RUN_OPTIONS)}
    build_options, work = _encode_on_ray(passages, options) if cls.uses_encoder else (options, None)
    retriever = cls.build(passages, **{k: v for k, v in build_options.items() if k not in _RUN_OPTIONS})
    dense = _dense_part(retriever)

    with atomic_directory(out, overwrite=overwrite, exists_hint=OVERWRITE_HINT) as tmp:
        write_passages(passages, tmp / PASSAGES_FILE)
        retriever.save(_part_dir(tmp, cls), with_passages=False)
        manifest = {
            "format_version": FORMAT_VERSION,
            "kind": kind,
            "encoder": options.get("encoder_spec") if cls.uses_encoder else None,
            "encoder_backend": dense.encoder_backend if dense else None,
            "n_passages": len(passages),
            "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "options": _jsonable_options(recorded),
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    drop_ray_work(work)
    return retriever


#: options of how one build ran, not of the index it made
_RUN_OPTIONS = ("ray", "ray_workers", "ray_shard_size")


def _encode_on_ray(passages: list[Passage], options: dict[str, Any]) -> tuple[dict[str, Any], Path | None]:
    """``options`` with the passages' vectors encoded on Ray when ``ray`` is among them (and none were given),
    and the job's shard folder; else ``options`` as given."""
    if not options.get("ray") or options.get("embeddings") is not None:
        return options, None
    from ragsieve.retrieve.dense import DEFAULT_BATCH_SIZE, build_backend

    backend = build_backend(options.get("encoder_backend"), options.get("encoder"), spec=options["encoder_spec"])
    vecs, truncated, work = ray_vectors(
        passages, encoder_spec=options["encoder_spec"], backend=backend, address=options["ray"],
        workers=options.get("ray_workers"), shard_size=options.get("ray_shard_size"),
        batch_size=options.get("batch_size", DEFAULT_BATCH_SIZE), show_progress=options.get("show_progress", True))
    return {**options, "embeddings": vecs, "truncated_count": truncated, "encoder_backend": backend}, work


def _dense_part(retriever: Retriever) -> DenseRetriever | None:
    if isinstance(retriever, DenseRetriever):
        return retriever
    return getattr(retriever, "dense", None)


#: build options a later ``add_to_index`` must repeat to get the same index
_KEPT_OPTIONS = ("exact", "m", "ef_construction", "ef_search", "k1", "b", "rrf_k", "depth")


def add_to_index(index_dir: str | Path, passages: Iterable[Passage], *, show_progress: bool = False,
                 ray: str | None = None, **ray_options: Any) -> Retriever:
    """Append ``passages`` to an existing index: only the new passages are encoded, on the backend that built
    the index (on Ray actors with ``ray="local"`` or an address; ``ray_workers``, ``ray_shard_size``).

    BM25 statistics are recomputed over the whole pool (cheap); dense vectors of the
    existing passages are reused from ``embeddings.npy`` and the vector index is rebuilt
    around them. The folder is replaced atomically, so a kill leaves the old index.

    Example::

        add_to_index("index/mine", read_corpus(["new_docs/"]))
    """
    if is_store_url(index_dir):  # rows join the live HNSW graph: nothing is rebuilt
        return add_to_store_index(str(index_dir), passages, show_progress=show_progress, ray=ray, **ray_options)
    path = Path(index_dir)
    manifest = read_manifest(path)
    old = load_index(path)
    new = check_passages(passages)
    clash = sorted({p.id for p in old.passages} & {p.id for p in new})
    if clash:
        raise RagsieveError(f"{path}: {len(clash)} passage id(s) already in the index, e.g. '{clash[0]}'")
    kind = manifest["kind"]
    cls = _retriever_class(kind)
    options = {k: v for k, v in (manifest.get("options") or {}).items() if k in _KEPT_OPTIONS}
    work = None
    if cls.uses_encoder:
        dense = _dense_part(old)
        vecs, truncated, work = new_vectors(new, dense.encoder_spec, dense.query_backend, show_progress, ray,
                                            **ray_options)
        before = dense.truncated_count  # None: built from injected vectors, so unknown it stays
        options.update(embeddings=np.concatenate([dense.embeddings, vecs]), encoder_spec=dense.encoder_spec,
                       encoder_backend=dense.encoder_backend,
                       truncated_count=None if before is None else before + truncated)
    retriever = build_index([*old.passages, *new], path, kind=kind, overwrite=True, **options)
    drop_ray_work(work)
    return retriever


def read_manifest(index_dir: str | Path) -> dict[str, Any]:
    """The parsed ``manifest.json`` of an index folder (one-line error if absent or broken).

    Example::

        read_manifest("indexes/nq")["kind"]
    """
    path = Path(index_dir)
    manifest_path = path / MANIFEST_FILE
    if not manifest_path.is_file():
        why = "folder does not exist" if not path.exists() else f"no {MANIFEST_FILE}"
        raise RagsieveError(f"{path}: not a ragsieve index ({why}); build one with `ragsieve index --out {path}`")
    manifest = read_json_artifact(manifest_path, INDEX_REBUILD)
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise RagsieveError(
            f"{manifest_path}: index format_version {version!r} is not supported (this ragsieve reads <= {FORMAT_VERSION})"
        )
    return manifest


def load_index(index_dir: str | Path) -> Retriever:
    """Load an index folder written by :func:`build_index`, or the PostgreSQL index a ``postgresql://`` URL names.

    Example::

        retriever = load_index("indexes/nq")
        retriever.kind, len(retriever.passages)
        load_index("postgresql://me@localhost/rag?table=docs").search("who wrote Hamlet", k=5)
    """
    if is_store_url(index_dir):
        return load_store_index(str(index_dir))
    path = Path(index_dir)
    manifest = read_manifest(path)
    cls = _retriever_class(manifest.get("kind"))
    passages = read_passages(path / PASSAGES_FILE)
    if manifest.get("n_passages") not in (None, len(passages)):
        raise RagsieveError(
            f"{path}: manifest says {manifest['n_passages']} passages, {PASSAGES_FILE} has {len(passages)}; {INDEX_REBUILD}"
        )
    return cls.load(_part_dir(path, cls), passages=passages)
