"""Reusable indexes in the cache dir, keyed by what they were built from."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

from ragsieve.data.records import Passage
from ragsieve.paths import cache_dir
from ragsieve.retrieve.base import Retriever


def cached_index_dir(name: str, passages: Sequence[Passage], kind: str, encoder_spec: str) -> Path:
    """A folder name that changes whenever the pool, kind or encoder does."""
    digest = hashlib.sha1(f"{kind}|{encoder_spec}".encode())
    for p in passages:
        digest.update(f"\x00{p.id}\x01{p.title}\x01{p.text}".encode())
    return cache_dir() / "indexes" / f"{name}-{kind}-{digest.hexdigest()[:12]}"


def build_or_load_index(
    name: str, passages: Sequence[Passage], kind: str, encoder_spec: str, **options
) -> tuple[Retriever, bool]:
    """Load the cached index for this exact pool, or build and cache it. Returns (index, reused)."""
    from ragsieve.retrieve.index import build_index, load_index

    path = cached_index_dir(name, passages, kind, encoder_spec)
    if (path / "manifest.json").exists():
        return load_index(path), True
    return build_index(passages, path, kind=kind, encoder_spec=encoder_spec, overwrite=True, **options), False
