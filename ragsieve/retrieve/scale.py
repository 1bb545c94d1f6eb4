"""Index encoding on Ray Data (``ragsieve index --ray ADDRESS|local``): the passages cut into shards, each shard
encoded by an actor holding one copy of the encoder, each finished shard written at once by the driver.

The driver keeps the finished shards in a work folder (``$RAGSIEVE_CACHE/index-shards/<job>/``, the job keyed by
the encoder, its backend and every passage text), so a build killed at any point (``kill -9`` included) encodes
only the unfinished shards when run again; the folder goes once the index is written. An actor computes exactly
what the single-process path computes (:func:`~ragsieve.retrieve.dense.embed_texts` on the same backend, one
thread), so the vectors do not depend on where they ran, and results are matched back by shard key, never by order.

Needs the optional extra ``ragsieve[ray]``. Example (a local Ray instance on this machine)::

    vecs, truncated = ray_passage_vectors(["a passage", "another"], encoder_spec="embedded:all-minilm-l6-v2",
                                          backend="openvino-bf16", address="local", work_dir=ray_work_dir(...))
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ragsieve.cluster import cluster_cpus, init_ray, set_actor_threads
from ragsieve.errors import RagsieveError
from ragsieve.retrieve.dense import DEFAULT_BATCH_SIZE

if TYPE_CHECKING:
    from ragsieve.data.records import Passage

#: passages per shard: what a kill can lose, and what one actor call encodes (≈ 10-30 s on one core)
DEFAULT_SHARD_SIZE = 1000


def _digest(*parts: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.hexdigest()


def ray_work_dir(texts: Sequence[str], encoder_spec: str, backend: str) -> Path:
    """The folder a Ray encoding of ``texts`` keeps its finished shards in (the same for a rerun of the same job).

    Example::

        ray_work_dir(["a passage"], "embedded:all-minilm-l6-v2", "openvino-bf16")
    """
    from ragsieve.paths import cache_dir

    return cache_dir() / "index-shards" / _digest(encoder_spec, backend, *texts)


def drop_ray_work(work_dir: Path | None) -> None:
    """Remove a finished job's shards (call it once the index they went into is written)."""
    if work_dir is not None:
        shutil.rmtree(work_dir, ignore_errors=True)


class ShardEncoder:
    """Ray actor: one copy of the encoder on ``threads`` threads; a row's shard of texts → its vectors and how many
    of its texts the encoder truncated."""

    def __init__(self, encoder_spec: str, backend: str, batch_size: int, threads: int = 1):
        from ragsieve.models.encoder import load_backend_encoder

        set_actor_threads(threads)
        self.encoder = load_backend_encoder(encoder_spec, backend, threads, bulk=True)
        self.backend, self.batch_size = backend, batch_size

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from ragsieve.retrieve.dense import count_truncated, embed_texts

        vectors, truncated = [], []
        for texts in batch["texts"]:
            texts = json.loads(texts)
            vecs = embed_texts(self.encoder, texts, batch_size=self.batch_size, show_progress=False,
                               backend=self.backend)
            vectors.append(vecs.tobytes())
            truncated.append(count_truncated(self.encoder, texts))
        return {"key": batch["key"], "vectors": np.array(vectors, dtype=object), "truncated": np.array(truncated)}


def _write_shard(path: Path, vectors: np.ndarray, truncated: int) -> None:
    from ragsieve.atomic import atomic_file

    with atomic_file(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, vectors=vectors, truncated=np.array(truncated))


def _read_shard(path: Path, size: int) -> tuple[np.ndarray, int] | None:
    """A finished shard of ``size`` vectors, or None (absent, or not whole: encoded again)."""
    try:
        with np.load(path) as data:
            vectors, truncated = data["vectors"], int(data["truncated"])
    except (OSError, ValueError, KeyError):
        return None
    return (vectors, truncated) if vectors.ndim == 2 and len(vectors) == size else None


def ray_vectors(passages: Sequence["Passage"], *, encoder_spec: str, backend: str, address: str,
                workers: int | None = None, shard_size: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
                show_progress: bool = True) -> tuple[np.ndarray, int, Path]:
    """(unit vectors of the passages' ``full_text``, how many were truncated, the job's shard folder to drop once the
    index is written): :func:`ray_passage_vectors` as an index build calls it.

    Example::

        vecs, truncated, work = ray_vectors(passages, encoder_spec=DEFAULT_ENCODER, backend="openvino-bf16",
                                            address="local")
    """
    from ragsieve.retrieve.dense import warn_truncated

    texts = [p.full_text for p in passages]
    work = ray_work_dir(texts, encoder_spec, backend)
    vecs, truncated = ray_passage_vectors(texts, encoder_spec=encoder_spec, backend=backend, address=address,
                                          work_dir=work, batch_size=batch_size, workers=workers,
                                          shard_size=shard_size or DEFAULT_SHARD_SIZE, show_progress=show_progress)
    warn_truncated(truncated, len(texts), "its window")
    return vecs, truncated, work


def new_vectors(passages: Sequence["Passage"], encoder_spec: str, backend: str, show_progress: bool,
                ray: str | None = None, ray_workers: int | None = None, ray_shard_size: int | None = None
                ) -> tuple[np.ndarray, int, Path | None]:
    """(vectors, how many truncated, shard folder or None) of passages an ``--add`` appends: on the index's
    ``backend``, in this process or on Ray (``ray``)."""
    if ray:
        return ray_vectors(passages, encoder_spec=encoder_spec, backend=backend, address=ray, workers=ray_workers,
                           shard_size=ray_shard_size, show_progress=show_progress)
    from ragsieve.retrieve.dense import passage_vectors

    vecs, truncated, _ = passage_vectors(passages, encoder_spec=encoder_spec, backend=backend,
                                         show_progress=show_progress)
    return vecs, int(truncated or 0), None


def ray_passage_vectors(
    texts: Sequence[str], *, encoder_spec: str, backend: str, address: str, work_dir: Path,
    batch_size: int = DEFAULT_BATCH_SIZE, shard_size: int = DEFAULT_SHARD_SIZE, workers: int | None = None,
    show_progress: bool = True,
) -> tuple[np.ndarray, int]:
    """(unit vectors of ``texts`` in order, how many were truncated), encoded on Ray (``address``: ``local`` or a
    cluster) by ``workers`` actors (default one per cluster CPU); finished shards in ``work_dir`` are reused."""
    if shard_size <= 0:
        raise RagsieveError(f"shard_size must be positive, got {shard_size}")
    shards = [list(texts[lo: lo + shard_size]) for lo in range(0, len(texts), shard_size)]
    keys = [_digest(str(i), *shard) for i, shard in enumerate(shards)]
    found = {k: _read_shard(work_dir / f"{k}.npz", len(s)) for k, s in zip(keys, shards)}
    done = {k: v for k, v in found.items() if v is not None}
    todo = [{"key": k, "texts": json.dumps(s), "size": len(s)} for k, s in zip(keys, shards) if k not in done]
    from ragsieve.progress import progress_bar

    with progress_bar() if show_progress else contextlib.nullcontext() as progress:
        if progress is not None:  # stderr: a bar on a terminal, plain lines in a log
            task = progress.add_task("embedding on ray", total=len(texts),
                                     completed=sum(len(s) for k, s in zip(keys, shards) if k in done))
            if done and todo:
                progress.note(f"{len(done)} of {len(shards)} shards already encoded in {work_dir}")
        if todo:
            init_ray(address)
            import ray

            n_actors = max(1, min(workers or cluster_cpus(), len(todo)))
            rows = ray.data.from_items(todo, override_num_blocks=len(todo)).map_batches(
                ShardEncoder, fn_constructor_kwargs={"encoder_spec": encoder_spec, "backend": backend,
                                                     "batch_size": batch_size},
                batch_size=1, concurrency=n_actors, num_cpus=1)
            size = {row["key"]: row["size"] for row in todo}
            for row in rows.iter_rows():  # as actors finish them, in any order
                vectors = np.frombuffer(row["vectors"], dtype=np.float32).reshape(size[row["key"]], -1)
                _write_shard(work_dir / f"{row['key']}.npz", vectors, int(row["truncated"]))
                done[row["key"]] = (vectors, int(row["truncated"]))
                if progress is not None:
                    progress.advance(task, size[row["key"]])
    missing = [k for k in keys if k not in done]
    if missing:
        raise RagsieveError(f"Ray returned no vectors for {len(missing)} of {len(keys)} shards; run again to "
                            "encode only those")
    if not keys:
        return np.zeros((0, 0), dtype=np.float32), 0
    return np.concatenate([done[k][0] for k in keys]), sum(done[k][1] for k in keys)
