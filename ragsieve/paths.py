"""Where ragsieve keeps caches and finds data, overridable by environment variables."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent


def cache_dir() -> Path:
    """``$RAGSIEVE_CACHE``, default ``~/.cache/ragsieve``; created on demand."""
    path = Path(os.environ.get("RAGSIEVE_CACHE") or Path.home() / ".cache" / "ragsieve").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path
