"""Where ragsieve keeps caches, finds data and resolves named artifacts (``embedded:<name>``)."""

from __future__ import annotations

import os
from pathlib import Path

from ragsieve.errors import ModelNotAvailable
from ragsieve.specs import embedded_name, shipped_asset

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent


def cache_dir() -> Path:
    """``$RAGSIEVE_CACHE``, default ``~/.cache/ragsieve``; created on demand."""
    path = Path(os.environ.get("RAGSIEVE_CACHE") or Path.home() / ".cache" / "ragsieve").expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


ASSETS_DIR = PACKAGE_DIR / "assets"

#: artifact kind → how a user builds one when the named one is missing
_HOW_TO_BUILD = {
    "probes": "build one with `ragsieve run experiments/probe_nq.yaml` (or `ragsieve fit`) and pass its folder",
    "graders": "train one with `ragsieve grader train` (or `ragsieve fit`) and pass its folder",
    "sieves": "build one with `ragsieve fit` and pass its folder",
}


def _shipped_folder(kind: str, name: str) -> Path | None:
    """The folder of the artifact of ``kind`` (``probes``, ...) shipped as ``embedded:<name>``, when it is there."""
    asset = shipped_asset(kind.removesuffix("s"), name)
    return ASSETS_DIR / asset if asset and (ASSETS_DIR / asset).is_dir() else None


def shipped_name(kind: str, text: str) -> bool:
    """``text`` is not a path but the bare name of an artifact shipped in the package (``default``)."""
    return "/" not in text and not Path(text).expanduser().exists() and _shipped_folder(kind, text) is not None


def resolve_artifact(kind: str, spec: str | Path) -> Path:
    """``embedded:<name>`` → ``assets/<kind>/<name>`` or ``$RAGSIEVE_CACHE/<kind>/<name>``; else a path."""
    text = str(spec)
    name = embedded_name(text)
    if name is None:
        path = Path(text).expanduser()
        if path.exists():
            return path
        if shipped_name(kind, text):  # a bare shipped name: `--grader default`
            return _shipped_folder(kind, text)
        raise ModelNotAvailable(f"no {kind[:-1]} at {path}; {_HOW_TO_BUILD.get(kind, 'build it first')}")
    shipped = _shipped_folder(kind, name)
    if shipped is not None:
        return shipped
    if (cache_dir() / kind / name).is_dir():  # built by the user (ragsieve fit), kept under the cache
        return cache_dir() / kind / name
    raise ModelNotAvailable(
        f"no {kind[:-1]} named '{name}' is shipped or cached (looked in {ASSETS_DIR / kind} and "
        f"{cache_dir() / kind}); {_HOW_TO_BUILD.get(kind, 'build it first')}"
    )
