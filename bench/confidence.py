"""Conf(Q+C) throughput: ragsieve's early-exit batched path vs the naive path.

Naive = one pair at a time, full forward with ``output_hidden_states=True``, then the
probe head. Same 64 (NQ question, ~150-token passage) pairs, same probe head, one run.
Writes ``bench/results/confidence.json``.

    python bench/confidence.py [--pairs 64] [--batch-size 16]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from ragsieve.machine import machine_info

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    import torch

    from ragsieve.data import load_dataset
    from ragsieve.data.records import Passage
    from ragsieve.models import load_local_llm
    from ragsieve.probe.hidden import HiddenStateExtractor, full_forward_state
    from ragsieve.probe.model import ConfidenceProbe, ProbeConfig, ProbeHead

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--passage-tokens", type=int, default=150)
    parser.add_argument("--probe", default="results/probe_nq/probe", help="saved probe; a random head if absent")
    parser.add_argument("--out", default="bench/results/confidence.json")
    args = parser.parse_args()

    llm = load_local_llm()
    if (Path(args.probe) / "probe_config.json").exists():
        probe = ConfidenceProbe.load(args.probe, llm, batch_size=args.batch_size)
        head_source = args.probe
    else:
        torch.manual_seed(0)
        layer = HiddenStateExtractor(llm, 0.5).layer
        cfg = ProbeConfig(llm.spec, layer, llm.num_layers, llm.hidden_size)
        probe = ConfidenceProbe(llm, ProbeHead(llm.hidden_size), cfg, batch_size=args.batch_size)
        head_source = "random head (no saved probe): same compute"

    ds = load_dataset("nq-oracle")
    pool = ds.passage_by_id()
    questions, contexts = [], []
    for q in ds.questions:
        if len(questions) == args.pairs:
            break
        p = pool[q.gold_passage_ids[0]]
        text, _ = llm.truncate_tokens(p.text, args.passage_tokens)
        if llm.count_tokens(text) >= args.passage_tokens - 10:  # keep pairs near the target length
            questions.append(q.text)
            contexts.append(Passage(p.id, text, p.title))
    prompts = probe.prompts(questions, contexts)
    prompt_tokens = [llm.count_tokens(p) for p in prompts]

    probe.score_batch(questions[:2], contexts[:2])  # warm-up (allocator, kernels) for both paths
    start = time.perf_counter()
    fast = probe.score_batch(questions, contexts)
    fast_s = time.perf_counter() - start

    start = time.perf_counter()
    naive_states = np.stack([full_forward_state(llm, p, probe.config.layer) for p in prompts])
    naive = probe.head.predict_proba(naive_states)
    naive_s = time.perf_counter() - start

    result = {
        "pairs": len(prompts),
        "batch_size": args.batch_size,
        "layer": probe.config.layer,
        "num_layers": llm.num_layers,
        "mean_prompt_tokens": float(np.mean(prompt_tokens)),
        "pairs_per_s": len(prompts) / fast_s,
        "naive_pairs_per_s": len(prompts) / naive_s,
        "speedup": naive_s / fast_s,
        "max_abs_conf_diff": float(np.abs(fast - naive).max()),
        "probe": head_source,
        "torch_threads": torch.get_num_threads(),
        "machine": machine_info(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
