"""``ragsieve probe extract|train|eval`` and ``ragsieve cbdr sweep``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from ragsieve.cli.app import app, console
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_LLM
from ragsieve.pipeline.config import DEFAULT_PROBE


probe_app = typer.Typer(help="Knowledge-boundary confidence probe.", no_args_is_help=True)
app.add_typer(probe_app, name="probe")


def _read_probe_rows(path: Path) -> list[dict]:
    from ragsieve.data import read_jsonl

    rows = []
    for lineno, row in read_jsonl(path).numbered():
        if not str(row.get("question", "")).strip():
            raise RagsieveError(f"{path}:{lineno}: missing or empty 'question'")
        rows.append(row)
    if not rows:
        raise RagsieveError(f"{path}: no rows")
    return rows


def _context_of(row: dict):
    from ragsieve.data.records import Passage

    text = row.get("context")
    return Passage("ctx", str(text), str(row.get("title", ""))) if text else None


@probe_app.command("extract")
def probe_extract_cmd(
    input: Path = typer.Option(..., "--input", help="jsonl rows {question, context?, title?}."),
    out: Path = typer.Option(..., "--out", help="Where to write the states (.npy)."),
    llm: str = typer.Option(DEFAULT_LLM, help="Local LLM spec."),
    layer: float = typer.Option(0.5, help="Layer index (int) or depth fraction (0.5 = L/2)."),
    max_prompt_tokens: int = typer.Option(1024, help="Prompt budget; contexts are truncated to fit."),
) -> None:
    """Extract pre-token hidden states for the QA prompts of each row."""
    import numpy as np

    from ragsieve.models import load_local_llm
    from ragsieve.probe.hidden import HiddenStateExtractor
    from ragsieve.prompts.builder import PromptBuilder

    rows = _read_probe_rows(input)
    model = load_local_llm(llm)
    builder = PromptBuilder(model, max_prompt_tokens=max_prompt_tokens)
    built = [builder.with_context(r["question"], [c] if (c := _context_of(r)) else []) for r in rows]
    prompts = [builder.to_chat(b.text) for b in built]
    extractor = HiddenStateExtractor(model, int(layer) if float(layer).is_integer() else layer)
    np.save(out, extractor.extract(prompts))
    truncated = sum(b.truncated_contexts for b in built)
    console.print(f"{len(rows)} states of layer {extractor.layer} → {out} ({truncated} context(s) truncated)")


@probe_app.command("train")
def probe_train_cmd(
    config: Path = typer.Argument(Path("experiments/probe_nq.yaml"), help="Probe experiment YAML."),
) -> None:
    """Label answers, extract states, train and evaluate a probe (the probe experiment)."""
    from ragsieve.cli.studies import run_study_file

    run_study_file(config, console)


@probe_app.command("eval")
def probe_eval_cmd(
    input: Path = typer.Option(..., "--input", help="jsonl rows {question, context?, correct?}."),
    probe: str = typer.Option(DEFAULT_PROBE, "--probe", help="Saved probe folder or embedded:<name>."),
    llm: str = typer.Option(DEFAULT_LLM, help="Local LLM spec (must match the probe)."),
) -> None:
    """Score rows with a saved probe; with `correct` labels, report AUROC and accuracy."""
    import numpy as np

    from ragsieve.eval.classification import classification_metrics
    from ragsieve.models import load_local_llm
    from ragsieve.probe.model import ConfidenceProbe

    rows = _read_probe_rows(input)
    scorer = ConfidenceProbe.load(probe, load_local_llm(llm))
    conf = scorer.score_batch([r["question"] for r in rows], [_context_of(r) for r in rows])
    labelled = [i for i, r in enumerate(rows) if "correct" in r]
    if labelled:
        y = np.array([int(rows[i]["correct"]) for i in labelled])
        m = classification_metrics(y, (conf[labelled] > 0.5).astype(int), conf[labelled])
        print(json.dumps({k: m[k] for k in ("n", "auroc", "accuracy", "precision", "recall", "f1")}))
    else:
        for r, c in zip(rows, conf):
            print(json.dumps({"question": r["question"], "confidence": float(c)}, ensure_ascii=False))


cbdr_app = typer.Typer(help="Confidence-based dynamic retrieval.", no_args_is_help=True)
app.add_typer(cbdr_app, name="cbdr")


@cbdr_app.command("sweep")
def cbdr_sweep_cmd(
    config: Path = typer.Argument(Path("experiments/cbdr_nq.yaml"), help="CBDR experiment YAML."),
    betas: Optional[str] = typer.Option(None, help="Override β values, e.g. 0,0.9,0.95."),
) -> None:
    """Sweep β × top-k on held-out questions: accuracy and retrieval rate."""
    from ragsieve.cli.studies import run_study_file

    overrides = {}
    if betas:
        try:
            overrides["betas"] = [float(b) for b in betas.split(",") if b.strip()]
        except ValueError:
            raise RagsieveError(f"bad --betas '{betas}'; expected e.g. 0,0.9,0.95") from None
    run_study_file(config, console, overrides)
