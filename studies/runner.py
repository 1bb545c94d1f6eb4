"""`ragsieve run CONFIG.yaml`: the studies named in YAML, one module each in this package.

A config file looks like::

    experiment: probe_nq      # a key of EXPERIMENTS
    out_dir: results/probe_nq
    params: {...}             # validated by that experiment's StrictConfig

``ragsieve run CONFIG.yaml --report-only`` rebuilds the report from what ``out_dir`` already holds,
for studies with a ``report`` method (evolve: the cells finished so far, e.g. committed by another session).

The registry holds the study classes themselves; each study imports its ML code inside
``run``, so importing this module stays cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from ragsieve.config import StrictConfig, build_config, read_mapping
from ragsieve.errors import RagsieveError
from ragsieve.progress import showing_reports
from studies.cascade import CascadeStudy
from studies.cbdr_nq import CBDRExperiment
from studies.evolve import EvolveExperiment
from studies.evolve_m0_sweep import EvolveM0Sweep
from studies.evolve_own_data import EvolveOwnDataStudy
from studies.grader import GraderExperiment
from studies.probe_nq import ProbeExperiment
from studies.prune import PruneStudy
from studies.prune_across import PruneAcrossStudy
from studies.prune_head import PruneHeadStudy
from studies.rerank_align import RerankAlignExperiment
from studies.rerank_align_guard import RerankAlignGuardStudy
from studies.rerank_base import RerankBaseStudy
from studies.rerank_distill import RerankDistillStudy
from studies.sieve_answers import SieveAnswersStudy

EXPERIMENTS: dict[str, type["Experiment"]] = {
    "probe_nq": ProbeExperiment,
    "cbdr_nq": CBDRExperiment,
    "rerank_base": RerankBaseStudy,
    "rerank_distill": RerankDistillStudy,
    "rerank_align": RerankAlignExperiment,
    "rerank_align_guard": RerankAlignGuardStudy,
    "grader": GraderExperiment,
    "evolve": EvolveExperiment,
    "evolve_m0_sweep": EvolveM0Sweep,
    "evolve_own_data": EvolveOwnDataStudy,
    "prune": PruneStudy,
    "prune_head": PruneHeadStudy,
    "prune_across": PruneAcrossStudy,
    "cascade": CascadeStudy,
    "sieve_answers": SieveAnswersStudy,
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
        return EXPERIMENTS[name]()
    except KeyError:
        raise RagsieveError(f"unknown experiment '{name}'; known: {', '.join(sorted(EXPERIMENTS))}") from None


def run_experiment_file(path: str | Path, console: Console | None = None, overrides: dict | None = None,
                        report_only: bool = False) -> dict:
    """Validate the whole file before any work starts, then run it (or only rebuild its report from the
    results already in ``out_dir``, for experiments that can: ``report_only``)."""
    console = console or Console()
    spec = build_config(ExperimentFile, read_mapping(path), source=str(path))
    experiment = load_experiment(spec.experiment)
    params = {**spec.params, **(overrides or {})}
    config = build_config(experiment.Config, params, source=f"{path}: params")
    out_dir = Path(spec.out_dir)
    if report_only:
        if not hasattr(experiment, "report"):
            raise RagsieveError(f"experiment '{spec.experiment}' has no report-only mode; run it without --report-only")
        if not out_dir.is_dir():
            raise RagsieveError(f"{out_dir} does not exist: nothing to report yet; run the experiment first")
        console.rule(f"[bold]{spec.experiment}[/] report ← {out_dir}")
        return experiment.report(config, out_dir, console)
    out_dir.mkdir(parents=True, exist_ok=True)
    console.rule(f"[bold]{spec.experiment}[/] → {out_dir}")
    # library code deep inside a study reports its steps (training, LLM scoring); a study with no bar of
    # its own for them would otherwise sit silent for an hour in a log
    with showing_reports():
        return experiment.run(config, out_dir, console)
