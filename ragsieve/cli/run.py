"""``ragsieve demo`` (the library's main job) and ``ragsieve run CONFIG`` (a study, from a source checkout)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ragsieve.cli.app import app, console


@app.command("demo")
def demo_cmd(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML/JSON overriding the embedded defaults."),
) -> None:
    """Run the main job on embedded defaults (what `make demo` runs)."""
    from ragsieve.config import load_config
    from ragsieve.pipeline.demo import DemoConfig, run_demo

    cfg = load_config(DemoConfig, config) if config else DemoConfig()
    run_demo(cfg, console)


@app.command("run")
def run_cmd(
    config: Path = typer.Argument(..., help="Experiment YAML (see experiments/)."),
    report_only: bool = typer.Option(
        False, "--report-only", help="Rebuild metrics.json, tables and plots from the results already in out_dir; "
        "train and score nothing (experiments that resume per cell, e.g. evolve)."),
) -> None:
    """Run an experiment config end to end and write its results (from a source checkout: studies/)."""
    from ragsieve.cli.studies import run_study_file

    run_study_file(config, console, report_only=report_only)

