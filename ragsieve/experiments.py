"""`ragsieve run CONFIG.yaml`: experiments named in YAML, implemented next to their method.

A config file looks like::

    experiment: probe_nq      # a key of EXPERIMENTS
    out_dir: results/probe_nq
    params: {...}             # validated by that experiment's StrictConfig

The registry maps names to "module:Class" strings so importing it loads no ML code.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from ragsieve.config import StrictConfig, build_config, read_mapping
from ragsieve.errors import RagsieveError

EXPERIMENTS: dict[str, str] = {
    "probe_nq": "ragsieve.probe.experiment:ProbeExperiment",
    "cbdr_nq": "ragsieve.gate.experiment:CBDRExperiment",
    "rerank_base": "ragsieve.studies.rerank_base:RerankBaseStudy",
    "rerank_align": "ragsieve.rerank.experiment:RerankAlignExperiment",
    "grader": "ragsieve.grade.experiment:GraderExperiment",
    "evolve": "ragsieve.evolve.experiment:EvolveExperiment",
}


class Experiment(Protocol):
    Config: type[StrictConfig]

    def run(self, config: Any, out_dir: Path, console: Console) -> dict: ...


class ExperimentFile(StrictConfig):
    experiment: str
    out_dir: str
    params: dict[str, Any] = {}


def load_experiment(name: str) -> Experiment:
    try:
        target = EXPERIMENTS[name]
    except KeyError:
        raise RagsieveError(f"unknown experiment '{name}'; known: {', '.join(sorted(EXPERIMENTS))}") from None
    module, _, cls = target.partition(":")
    return getattr(importlib.import_module(module), cls)()


def run_experiment_file(path: str | Path, console: Console | None = None, overrides: dict | None = None) -> dict:
    """Validate the whole file before any work starts, then run it."""
    console = console or Console()
    spec = build_config(ExperimentFile, read_mapping(path), source=str(path))
    experiment = load_experiment(spec.experiment)
    params = {**spec.params, **(overrides or {})}
    config = build_config(experiment.Config, params, source=f"{path}: params")
    out_dir = Path(spec.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    console.rule(f"[bold]{spec.experiment}[/] → {out_dir}")
    return experiment.run(config, out_dir, console)
