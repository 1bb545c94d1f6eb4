"""`ragsieve run experiments/cbdr_nq.yaml`: β sweep of CBDR on held-out NQ questions.

Uses the probe and the question split written by the probe experiment, so every
question here is one the probe never trained on.

Besides the sweep it writes Table 3 (``table3`` in ``metrics.json``): per (β, top-k) the
accuracy with its Wilson interval, a random gate at the same retrieval rate (expected
accuracy, interval over which questions retrieve, permutation p), the exact McNemar test
against always retrieving; the oracle gate (retrieve only when closed-book is wrong);
``skip_at_parity`` with a bootstrap interval and the share parity is *shown* for (95 %).
With ``reuse_probe_generations`` the probe run's stored answers to the same prompts
(closed-book, and top-1 when it is the gold passage) are reused instead of regenerated.

Example::

    ragsieve run experiments/cbdr_nq.yaml   # after experiments/probe_nq.yaml
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
from studies.common import plot_sweep, progress_bar


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
    # -- Table 3 at scale (issue #15) --
    n_boot: int = 1000  # bootstrap resamples of questions for skip_at_parity's interval
    random_draws: int = 2000  # random gates drawn per (β, top-k) row
    parity_confidence: float = 0.95  # skip_at_parity_shown: parity's loss bound at this level
    # Reuse the probe run's answers to identical prompts (same LLM, template, max_new_tokens)
    reuse_probe_generations: bool = False
    min_questions: int = 0  # refuse to run on fewer held-out questions (a scale config's promise)


class CBDRExperiment:
    Config = CBDRExperimentConfig

    def run(self, cfg: CBDRExperimentConfig, out_dir: Path, console: Console) -> dict:
        from ragsieve.models import load_local_llm
        from ragsieve.probe.model import ConfidenceProbe, load_head

        t0 = time.perf_counter()
        probe_dir = Path(cfg.probe_results)
        ds, questions = _held_out_questions(cfg, probe_dir)
        probe_config, _ = load_head(probe_dir / "probe")
        llm = load_local_llm(probe_config.llm_spec)
        probe = ConfidenceProbe.load(probe_dir / "probe", llm, batch_size=cfg.batch_size)
        conf_q = probe.score_batch([q.text for q in questions])
        closed, rag, reused = _answer(cfg, out_dir, probe_dir, probe_config, llm, probe.builder, ds, questions,
                                      console)
        n = len(questions)
        gates = _gate_results(cfg, conf_q, closed, rag)
        result = {
            **gates,
            "generations_reused_from_probe": reused,
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
        plot_sweep(gates["table3"], out_dir / "accuracy_vs_rr.png", float(closed.mean()), oracle=gates["oracle_gate"])
        _print_table3(cfg, n, gates, console)
        return result


def _held_out_questions(cfg: CBDRExperimentConfig, probe_dir: Path) -> tuple:
    """The dataset and the probe run's ``cfg.split`` questions in it (at most ``n_questions``); refused when
    fewer than ``min_questions`` remain."""
    from ragsieve.data import read_split_file
    from studies.probe_nq import load_study_dataset

    split_file = probe_dir / "split.json"
    ids = read_split_file(split_file, (cfg.split,))[cfg.split]
    ds = load_study_dataset(cfg.dataset, data_dir=cfg.data_dir)
    by_id = {q.id: q for q in ds.questions}
    # ids of other sources (NQ-open questions of a mixed probe run) have no passage here: left out
    questions = [by_id[i] for i in ids if i in by_id][: cfg.n_questions or None]
    if len(questions) < max(cfg.min_questions, 1):
        raise RagsieveError(
            f"{split_file}: {len(questions)} '{cfg.split}' questions of {cfg.dataset}, "
            f"fewer than min_questions={cfg.min_questions}"
        )
    return ds, questions


def _answer(cfg: CBDRExperimentConfig, out_dir: Path, probe_dir: Path, probe_config, llm, builder, ds, questions,
            console: Console) -> tuple:
    """Each question answered closed-book and with the retriever's top k for every k (stored in
    ``generations.jsonl``, resumable): whether closed-book was right, per k whether top-k was, and how many
    answers came from the probe run."""
    from ragsieve.probe.labels import LabelRequest, label_generations
    from ragsieve.retrieve.cached import build_or_load_index

    retriever, _ = build_or_load_index(cfg.dataset, ds.passages, cfg.retriever, cfg.encoder)
    hits = retriever.search_batch([q.text for q in questions], k=max(cfg.top_ks))
    requests = [LabelRequest(q.id, q.text, q.answers, "closed") for q in questions]
    for k in cfg.top_ks:
        requests += [
            LabelRequest(q.id, q.text, q.answers, f"top{k}", [h.passage for h in row[:k]])
            for q, row in zip(questions, hits)
        ]
    reused = 0
    if cfg.reuse_probe_generations:
        reused = _reuse_probe_answers(cfg, probe_dir, probe_config, requests, out_dir / "generations.jsonl",
                                      console)
    with progress_bar(console) as bar:
        task = bar.add_task("answer closed-book / top-k", total=len(requests))
        gens = label_generations(
            llm, builder, requests, out_dir / "generations.jsonl",
            max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size, progress=lambda n: bar.advance(task, n),
        )
    n = len(questions)
    closed = np.array([g.correct for g in gens[:n]])
    rag = {k: np.array([g.correct for g in gens[n * (i + 1) : n * (i + 2)]]) for i, k in enumerate(cfg.top_ks)}
    return closed, rag, reused


def _gate_results(cfg: CBDRExperimentConfig, conf_q: np.ndarray, closed: np.ndarray, rag: dict) -> dict:
    """The β sweep, skip at parity (on the grid, the fine grid, with its bootstrap interval and where parity is
    shown), the oracle's skip, Table 3 and the oracle gate: the first keys of ``metrics.json``, in its order."""
    from ragsieve.gate.cbdr import gate_table, oracle_gate, skip_at_parity, skip_at_parity_interval, sweep_cbdr

    sweep = sweep_cbdr(conf_q, closed, rag, cfg.betas)
    parity = {f"top{k}": skip_at_parity(conf_q, closed, rag[k], cfg.betas, cfg.tolerance) for k in cfg.top_ks}
    parity_fine = {f"top{k}": skip_at_parity(conf_q, closed, rag[k], None, cfg.tolerance) for k in cfg.top_ks}
    # What a perfect gate could do: skip exactly the questions where retrieval does not help.
    oracle = {f"top{k}": float(np.mean(closed >= rag[k])) for k in cfg.top_ks}
    table3 = gate_table(conf_q, closed, rag, cfg.betas, n_draws=cfg.random_draws)
    oracle_gates = {f"top{k}": oracle_gate(closed, rag[k]) for k in cfg.top_ks}
    parity_ci = {
        f"top{k}": skip_at_parity_interval(conf_q, closed, rag[k], cfg.betas, cfg.tolerance, n_boot=cfg.n_boot)
        for k in cfg.top_ks
    }
    parity_shown = {
        f"top{k}": skip_at_parity(conf_q, closed, rag[k], cfg.betas, cfg.tolerance, cfg.parity_confidence)
        for k in cfg.top_ks
    }
    return {
        "sweep": sweep,
        "skip_at_parity": max(p["skip"] for p in parity.values()),
        "skip_at_parity_by_k": parity,
        "skip_at_parity_fine_grid": parity_fine,
        "oracle_skip_at_parity": oracle,
        "skip_at_parity_ci95": parity_ci,
        f"skip_at_parity_shown_{round(cfg.parity_confidence * 100)}": parity_shown,
        "table3": table3,
        "oracle_gate": oracle_gates,
    }


def _print_table3(cfg: CBDRExperimentConfig, n: int, gates: dict, console: Console) -> None:
    """Table 3 (per β and top-k: retrieval rate, accuracy, the random gate at that rate) and skip at parity."""
    table = Table(title=f"CBDR on {n} held-out {cfg.dataset} questions")
    for col in ("β", "top-k", "RR", "accuracy [95 % CI]", "random gate, same RR", "p (≤ random)"):
        table.add_column(col, justify="right")
    for row in gates["table3"]:
        rnd = row["random"]
        table.add_row(
            f"{row['beta']:.2f}", str(row["top_k"]), f"{row['rr']:.3f}",
            f"{row['accuracy']:.3f} [{row['ci95'][0]:.3f}, {row['ci95'][1]:.3f}]",
            f"{rnd['expected_accuracy']:.3f} [{rnd['low']:.3f}, {rnd['high']:.3f}]", f"{rnd['p_value']:.3f}",
        )
    console.print(table)
    console.print(f"skip at parity (grid): {gates['skip_at_parity_by_k']}; oracle: {gates['oracle_skip_at_parity']}")
    console.print("skip at parity, bootstrap 95 % CI: " + ", ".join(
        f"{k} {v['skip']:.3f} [{v['low']:.3f}, {v['high']:.3f}]" for k, v in gates["skip_at_parity_ci95"].items()))


def _reuse_probe_answers(cfg: CBDRExperimentConfig, probe_dir: Path, probe_config, requests, out_path: Path,
                         console: Console) -> int:
    """Copy the probe run's answers to identical prompts, if it answered them the same way."""
    from ragsieve.probe.labels import reuse_generations
    from studies.probe_nq import answer_settings_differ

    # the prompts are built by the probe's own builder, so only the answer length can differ
    made = json.loads((probe_dir / "metrics.json").read_text()).get("config", {}) \
        if (probe_dir / "metrics.json").is_file() else {}
    problem = answer_settings_differ(probe_dir, made.get("llm", ""), cfg.max_new_tokens, probe_config.max_prompt_tokens)
    if problem:  # other answer lengths give other labels: reusing them would mix two settings
        console.print(f"[yellow]reuse_probe_generations: {problem}; answering everything[/]")
        return 0
    source = probe_dir / "generations.jsonl"
    served = reuse_generations(requests, out_path, [source])
    console.print(f"{served} of {len(requests)} answers come from {source}")
    return served
