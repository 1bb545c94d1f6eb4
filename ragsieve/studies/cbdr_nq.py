"""`ragsieve run experiments/cbdr_nq.yaml`: β sweep of CBDR on held-out NQ questions.

Uses the probe and the question split written by the probe experiment, so every
question here is one the probe never trained on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.studies.common import plot_sweep, progress_bar


class CBDRExperimentConfig(StrictConfig):
    probe_results: str = "results/probe_nq"  # holds probe/, split.json
    split: str = "test"
    n_questions: int = 0  # 0 = the whole split
    betas: list[float] = [0.0, 0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 1.0]
    top_ks: list[int] = [1, 3]
    encoder: str = DEFAULT_ENCODER
    retriever: str = "hybrid"  # bm25 | dense | hybrid
    dataset: str = "nq-oracle"
    max_new_tokens: int = 16
    max_prompt_tokens: int = 1024
    batch_size: int = 16
    tolerance: float = 0.005  # "accuracy parity" = at most 0.5 pp below always retrieving
    data_dir: str | None = None


class CBDRExperiment:
    Config = CBDRExperimentConfig

    def run(self, cfg: CBDRExperimentConfig, out_dir: Path, console: Console) -> dict:
        from ragsieve.data import load_dataset
        from ragsieve.gate.cbdr import skip_at_parity, sweep_cbdr
        from ragsieve.models import load_local_llm
        from ragsieve.probe.labels import LabelRequest, label_generations
        from ragsieve.probe.model import ConfidenceProbe, load_head
        from ragsieve.retrieve.cached import build_or_load_index

        t0 = time.perf_counter()
        probe_dir = Path(cfg.probe_results)
        split_file = probe_dir / "split.json"
        if not split_file.is_file():
            raise RagsieveError(f"{split_file} missing: run experiments/probe_nq.yaml first")
        ids = json.loads(split_file.read_text()).get(cfg.split)
        if not ids:
            raise RagsieveError(f"{split_file} has no '{cfg.split}' split")
        ds = load_dataset(cfg.dataset, data_dir=cfg.data_dir)
        by_id = {q.id: q for q in ds.questions}
        questions = [by_id[i] for i in ids if i in by_id][: cfg.n_questions or None]

        probe_config, _ = load_head(probe_dir / "probe")
        llm = load_local_llm(probe_config.llm_spec)
        probe = ConfidenceProbe.load(probe_dir / "probe", llm, batch_size=cfg.batch_size)
        conf_q = probe.score_batch([q.text for q in questions])

        retriever, _ = build_or_load_index(cfg.dataset, ds.passages, cfg.retriever, cfg.encoder)
        hits = retriever.search_batch([q.text for q in questions], k=max(cfg.top_ks))
        requests = [LabelRequest(q.id, q.text, q.answers, "closed") for q in questions]
        for k in cfg.top_ks:
            requests += [
                LabelRequest(q.id, q.text, q.answers, f"top{k}", [h.passage for h in row[:k]])
                for q, row in zip(questions, hits)
            ]
        with progress_bar(console) as bar:
            task = bar.add_task("answer closed-book / top-k", total=len(requests))
            gens = label_generations(
                llm, probe.builder, requests, out_dir / "generations.jsonl",
                max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, progress=lambda n: bar.advance(task, n),
            )
        n = len(questions)
        closed = np.array([g.correct for g in gens[:n]])
        rag = {k: np.array([g.correct for g in gens[n * (i + 1) : n * (i + 2)]]) for i, k in enumerate(cfg.top_ks)}

        sweep = sweep_cbdr(conf_q, closed, rag, cfg.betas)
        parity = {f"top{k}": skip_at_parity(conf_q, closed, rag[k], cfg.betas, cfg.tolerance) for k in cfg.top_ks}
        parity_fine = {f"top{k}": skip_at_parity(conf_q, closed, rag[k], None, cfg.tolerance) for k in cfg.top_ks}
        # What a perfect gate could do: skip exactly the questions where retrieval does not help.
        oracle = {f"top{k}": float(np.mean(closed >= rag[k])) for k in cfg.top_ks}
        result = {
            "sweep": sweep,
            "skip_at_parity": max(p["skip"] for p in parity.values()),
            "skip_at_parity_by_k": parity,
            "skip_at_parity_fine_grid": parity_fine,
            "oracle_skip_at_parity": oracle,
            "n_questions": n,
            "closed_book_accuracy": float(closed.mean()),
            "always_retrieve_accuracy": {f"top{k}": float(v.mean()) for k, v in rag.items()},
            "confidence_summary": {
                "mean": float(conf_q.mean()),
                "quantiles": {str(q): float(np.quantile(conf_q, q)) for q in (0.1, 0.25, 0.5, 0.75, 0.9)},
            },
            "probe": str(probe_dir / "probe"),
            "seconds": time.perf_counter() - t0,
            "config": cfg.model_dump(),
        }
        (out_dir / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
        plot_sweep(sweep, out_dir / "accuracy_vs_rr.png", float(closed.mean()))

        table = Table(title=f"CBDR on {n} held-out {cfg.dataset} questions")
        for col in ("β", "top-k", "RR", "accuracy"):
            table.add_column(col, justify="right")
        for row in sweep:
            table.add_row(f"{row['beta']:.2f}", str(row["top_k"]), f"{row['rr']:.3f}", f"{row['accuracy']:.3f}")
        console.print(table)
        console.print(f"skip at parity (grid): {parity}; oracle: {oracle}")
        return result
