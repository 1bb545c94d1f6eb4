"""CPU-hour estimate of an evolving-reranker config before running it (issue #16).

Counts the verdict evaluations and training steps the config implies, cell by cell, and
prices them with per-token costs: evaluation (one forward, no grad) and a training step
(forward + backward of a batch of 8 prompts), both linear in prompt tokens on CPU.

    python bench/evolve_budget.py experiments/evolve_scale_stage1.yaml [--eval-ms 1.9] [--train-ms 5.8]

Defaults are the idle-machine figures of /work/shared/NOTES.md (1 thread: ≈ 1.9 ms per
evaluated token, ≈ 5.8 ms per trained token); ``results/evolve/PLAN.md`` lists what
was measured under load. Counts are upper bounds where the data decides (CautiousDPO's
accepted pairs are taken as 75 % of a round; a round that trains nothing skips its test).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Mean prompt tokens with SmolLM2's chat template, passage cut at max_prompt_tokens = 320
# (measured on 16-40 SFT-set prompts each, 2026-11-23; MultiRC / PubMedQA are mostly at the cap).
PROMPT_TOKENS = {"fever": 181, "anli": 162, "hotpotqa-distractor": 111, "bioasq": 108, "multirc": 297, "pubmedqa": 308}
CAUTIOUS_ACCEPT = 0.75  # share of a round CautiousDPO accepts (the small study: 60-100 %)
DOWNSTREAM_SENTENCES = 41  # candidate sentences per HotpotQA question
GENERATION_SECONDS = 2.5  # one short answer with a ~400-token context (≈ 19 tok/s greedy + prefill)


def cell_counts(cfg, ds: str, name: str, method) -> dict[str, float]:
    """(evaluations, training steps) of one cell, M0's shared work excluded."""
    size = cfg.sizes_for(ds)
    r, n, b = cfg.rounds, size.per_round, cfg.train.batch_size
    f = cfg.forgetting_per_split
    evals = (r - 1) * n  # M_{t-1} on D_t; M0 on D_1 is shared
    steps = 0.0
    kind = method.kind
    if kind == "sft-only":
        return {"evals": evals + r * f, "steps": 0.0}
    new = n * (CAUTIOUS_ACCEPT if kind == "cautious-dpo" else 1.0)
    alpha = method.alpha if kind in ("replay-dpo", "cautious-dpo") else 1.0
    replayed = round(new * (1 - alpha) / alpha) if alpha < 1 else 0
    steps = r * math.ceil((new + replayed) / b) * cfg.train.epochs
    evals += r * replayed  # DPO reference log-probs of replayed pairs
    evals += r * cfg.test_size  # M_t on the test set after every round
    evals += sum(f * (t + 1) for t in range(1, r + 1))  # forgetting samples of splits 0..t
    # CautiousDPO's LLM-judge votes are cached per dataset: counted once in dataset_counts
    return {"evals": evals, "steps": steps}


def dataset_counts(cfg, ds: str, cells) -> dict[str, float]:
    """M0 (training + test + D_1 + SFT-set sample), the judges and the downstream QA."""
    size, recipe = cfg.sizes_for(ds), cfg.m0_train_for(ds)
    out = {"m0_steps": math.ceil(size.initial / recipe.batch_size) * recipe.epochs,
           "m0_evals": cfg.test_size + size.per_round + cfg.forgetting_per_split}
    cautious = any(c.method.kind == "cautious-dpo" for c in cells)
    llm_judges = sum(1 for j in cfg.judges if j.kind == "llm")
    # calibration on the SFT set + votes on (at most) every round example, once per dataset
    out["judge_evals"] = llm_judges * (size.initial + cfg.rounds * size.per_round) if cautious else 0
    d = cfg.downstream
    on = d.enabled and ds == "hotpotqa-distractor"
    qa = [c for c in cells if on and (d.methods is None or c.name in d.methods)]
    # the base reranker's cost is taken as an LLM's: an upper bound
    rankers = len(qa) + (1 if on and d.base_reranker else 0)
    out["qa_evals"] = rankers * d.held_out_questions * DOWNSTREAM_SENTENCES
    # + the gold-support and closed-book baselines, computed once
    out["qa_generations"] = (rankers + 2) * d.held_out_questions if on else 0
    return out


def estimate(path: str, eval_ms: float, train_ms: float) -> dict:
    from ragsieve.config import build_config, read_mapping
    from studies.evolve import EvolveExperimentConfig, plan_cells

    spec = read_mapping(path)
    cfg = build_config(EvolveExperimentConfig, spec["params"])
    cells = plan_cells(cfg)
    per_dataset, total = {}, 0.0
    for ds in cfg.datasets:
        tokens = min(PROMPT_TOKENS.get(ds, 200), cfg.max_prompt_tokens)
        e, s = eval_ms * tokens / 1000, train_ms * tokens * cfg.train.batch_size / 1000
        mine = [c for c in cells if c.dataset == ds]
        rows = {}
        for c in mine:
            k = cell_counts(cfg, ds, c.name, c.method)
            rows[c.name] = round((k["evals"] * e + k["steps"] * s) / 3600, 2)
        shared = dataset_counts(cfg, ds, mine)
        shared_h = (shared["m0_steps"] * s + (shared["m0_evals"] + shared["judge_evals"]) * e) / 3600
        qa_h = (shared["qa_evals"] * 113 * eval_ms / 1000 + shared["qa_generations"] * GENERATION_SECONDS) / 3600
        hours = sum(rows.values()) + shared_h + qa_h
        per_dataset[ds] = {"cells_h": rows, "m0_and_judges_h": round(shared_h, 2), "downstream_h": round(qa_h, 2),
                           "total_h": round(hours, 2), "s_per_eval": round(e, 3), "s_per_step": round(s, 2)}
        total += hours
    return {"config": path, "eval_ms_per_token": eval_ms, "train_ms_per_token": train_ms,
            "per_dataset": per_dataset, "total_h": round(total, 1), "cells": len(cells)}


def main() -> None:
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("--eval-ms", type=float, default=1.9, help="ms per evaluated prompt token")
    ap.add_argument("--train-ms", type=float, default=5.8, help="ms per trained prompt token")
    args = ap.parse_args()
    print(json.dumps(estimate(args.config, args.eval_ms, args.train_ms), indent=1))


if __name__ == "__main__":
    main()
