"""Grading throughput: config C (batched classification) vs the prompted generative baseline.

Both grade the same (NQ question, gold passage cut to ~``--passage-tokens``) pairs with
the same grading prompt on the embedded SmolLM2, one run each:

* config C: one batched forward per ``--batch-size`` pairs, P(relevant) from the
  classification head (the saved grader if present, else a fresh head: same compute);
* generative baseline: the LLM asked the same question, answering greedily with up to
  ``--max-new-tokens`` tokens (batched the same way), the answer parsed to yes/no —
  what an LLM-as-judge grading step costs;
* for reference, the prompted baseline read from next-token logits (one forward, no decoding).

Writes ``bench/results/grader.json`` with ``speedup`` = C pairs/s ÷ generative pairs/s.

    python bench/grader.py [--pairs 64] [--batch-size 16] [--max-new-tokens 8]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
from ragsieve.machine import machine_info

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    import torch

    from ragsieve.data import load_dataset
    from ragsieve.registry import load_grader, new_grader
    from ragsieve.grade.judge import LLMJudge
    from ragsieve.models import load_local_llm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--passage-tokens", type=int, default=150)
    parser.add_argument("--max-new-tokens", type=int, default=8, help="the LLM judge's default answer budget")
    parser.add_argument("--grader", default="results/grader/models/C-long",
                        help="saved config C (experiments/grader.yaml saves C-long); a fresh head if absent")
    parser.add_argument("--out", default="bench/results/grader.json")
    args = parser.parse_args()

    if (Path(args.grader) / "grader_config.json").exists():
        classifier = load_grader(args.grader)
        source = args.grader
    else:
        torch.manual_seed(0)
        classifier = new_grader("classifier", max_passage_tokens=args.passage_tokens)
        source = "fresh classification head (no saved config C): same compute"
    classifier.batch_size = args.batch_size
    llm = load_local_llm(classifier.config.base)
    tokenizer = classifier.tokenizer

    ds = load_dataset("nq-oracle")
    pool = ds.passage_by_id()
    queries, passages = [], []
    for q in ds.questions:
        if len(queries) == args.pairs:
            break
        p = pool[q.gold_passage_ids[0]]
        ids = tokenizer(p.full_text, add_special_tokens=False)["input_ids"]
        if len(ids) >= args.passage_tokens:  # keep pairs near the target length
            queries.append(q.text)
            passages.append(tokenizer.decode(ids[: args.passage_tokens]))
    prompt_tokens = [len(classifier.prompt.encode(q, p).input_ids) for q, p in zip(queries, passages)]

    classifier.score_pairs(queries[:2], passages[:2])  # warm-up (allocator, kernels) for every path
    llm.generate(["warm up"], max_new_tokens=2)
    start = time.perf_counter()
    scores = classifier.score_pairs(queries, passages)
    c_s = time.perf_counter() - start

    class _Pair:
        def __init__(self, i: int):
            self.id, self.query, self.passage = str(i), queries[i], passages[i]

    with tempfile.TemporaryDirectory() as tmp:  # a fresh store: every pair is really generated
        judge = LLMJudge(  # the grader's own system prompt: both paths read the same prompt
            llm, Path(tmp) / "answers.jsonl", batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
            system=classifier.config.system,
        )
        start = time.perf_counter()
        report = judge.label([_Pair(i) for i in range(len(queries))])
        gen_s = time.perf_counter() - start

    prompted = new_grader("prompted", classifier.config.base, max_passage_tokens=args.passage_tokens)
    prompted.batch_size = args.batch_size
    start = time.perf_counter()
    prompted.score_pairs(queries, passages)
    logits_s = time.perf_counter() - start

    n = len(queries)
    result = {
        "pairs": n,
        "batch_size": args.batch_size,
        "mean_prompt_tokens": float(np.mean(prompt_tokens)),
        "config_c_pairs_per_s": n / c_s,
        "generative_pairs_per_s": n / gen_s,
        "prompted_logits_pairs_per_s": n / logits_s,
        "speedup": gen_s / c_s,
        "generative_max_new_tokens": args.max_new_tokens,
        "generative_unparseable": report.unparseable,
        "config_c_positive_rate": float((scores >= classifier.threshold).mean()),
        "grader": source,
        "torch_threads": torch.get_num_threads(),
        "machine": machine_info(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
