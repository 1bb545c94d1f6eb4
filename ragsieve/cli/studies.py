"""Where ``ragsieve run`` (and ``probe train``, ``cbdr sweep``) find the studies: a source checkout.

The studies behind ``results/`` are the repository's top-level ``studies`` package, which ``pip install``
does not ship: the library never imports them (pyproject.toml's import contracts), and the CLI loads them at
run time from the checkout that holds the config, or the working folder's.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

from rich.console import Console

from ragsieve.errors import RagsieveError

#: what marks a folder as a checkout with studies: the module that runs a config
STUDY_RUNNER = Path("studies") / "runner.py"


def checkout_root(config: Path, cwd: Path | None = None) -> Path | None:
    """The nearest folder holding ``studies/runner.py``: the config's folder and its parents first (so
    ``ragsieve run /path/to/checkout/experiments/x.yaml`` works from anywhere), then the working folder's."""
    for start in (config.resolve().parent, (cwd or Path.cwd()).resolve()):
        for folder in (start, *start.parents):
            if (folder / STUDY_RUNNER).is_file():
                return folder
    return None


def _runner_of(root: Path):
    """``studies.runner`` of the checkout at ``root``, importable once ``root`` is on ``sys.path``."""
    if str(root) not in sys.path:
        sys.path.append(str(root))  # last: the checkout's tools/, tests/ ... must not shadow installed packages
    runner = importlib.import_module("studies.runner")
    found = Path(runner.__file__).resolve()
    if found != (root / STUDY_RUNNER).resolve():  # another `studies` package imported first would run instead
        raise RagsieveError(f"the studies of {root} are shadowed by another `studies` package at {found.parent}")
    return runner


def run_study_file(config: Path, console: Console, overrides: dict | None = None, report_only: bool = False) -> dict:
    """Run a study config (``experiments/<study>.yaml``) with the studies of the checkout it belongs to."""
    if not config.is_file():  # a mistyped path is told as such, not as a missing checkout
        raise RagsieveError(f"{config}: config not found")
    root = checkout_root(config)
    if root is None:
        raise RagsieveError(
            f"{config}: studies run from a source checkout of ragsieve (its studies/ package is not installed); "
            "run this from a clone of the repository, e.g. `ragsieve run experiments/probe_nq.yaml`")
    return _runner_of(root).run_experiment_file(config, console, overrides, report_only=report_only)
