"""Do a fit's sentence labels find the sentence that holds the answer? (issue #71)

Reads a fit's ``<work>/sentence_shifts.jsonl`` (the ``sentences`` phase's rows: ids, spans and numbers), the
fit's QA file and its index, and for each train question with an answer-bearing sentence among other sentences
reports the AUROC of the labels (:func:`ragsieve.fit.sentences.examples_from_row`) against "the sentence contains
a gold answer", and whether the top-labelled sentence holds one, beside a random sentence's chance. Means with a
95 % bootstrap interval over questions. One line per signal found in the rows (``answer likelihood``,
``probe Conf``; rows written before the signal was recorded are ``probe Conf``)::

    python studies/sentence_label_signal.py ~/.cache/ragsieve/fits/nq-next
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    from sklearn.metrics import roc_auc_score

    from ragsieve.data.jsonl import read_jsonl
    from ragsieve.data.records import Question
    from ragsieve.eval.qa import contains_answer
    from ragsieve.eval.stats import bootstrap_metric
    from ragsieve.fit.sentences import SHIFTS_FILE, examples_from_row
    from ragsieve.paths import cache_dir
    from ragsieve.retrieve import load_index

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fit", type=Path, help="bench/fit.py's --out (holds qa.jsonl and sieve/work)")
    parser.add_argument("--index", type=Path, help="the fit's index (default: the cache's index, when it has one)")
    args = parser.parse_args()
    qa = {r["id"]: r for r in read_jsonl(args.fit / "qa.jsonl")}
    cached = sorted((cache_dir() / "indexes").glob("*")) if args.index is None else []
    if args.index is None and len(cached) != 1:
        parser.error(f"{len(cached)} indexes in {cache_dir() / 'indexes'}: name the fit's with --index")
    index = args.index or cached[0]
    pool = {p.id: p for p in load_index(index).passages}
    by_signal: dict[str, list[dict]] = {}
    for row in read_jsonl(args.fit / "sieve" / "work" / SHIFTS_FILE):
        by_signal.setdefault(row.get("signal", "probe Conf"), []).append(row)
    for signal, rows in by_signal.items():
        aucs, top, chance = [], [], []
        for row in rows:
            q = qa[row["question_id"]]
            question = Question(q["id"], q["question"], q["answers"])
            labels, gold = [], []
            for e in examples_from_row(question, [pool[i] for i in row["passage_ids"]], row):
                for (a, b), y in zip(e.spans, e.labels):
                    labels.append(y)
                    gold.append(contains_answer(e.passage.text[a:b], q["answers"]))
            gold_arr = np.asarray(gold)
            if 0 < gold_arr.sum() < len(gold_arr):
                aucs.append(roc_auc_score(gold_arr, labels))
                top.append(float(gold_arr[int(np.argmax(labels))]))
                chance.append(float(gold_arr.mean()))
        cells = []
        for name, values in (("AUROC", aucs), ("top label holds an answer", top), ("a random sentence", chance)):
            mean, lo, hi = bootstrap_metric(np.mean, np.asarray(values), seed=0)  # each value is one question
            cells.append(f"{name} {mean:.3f} [{lo:.3f}, {hi:.3f}]")
        print(json.dumps(signal), f"n = {len(aucs)} of {len(rows)} questions:", "; ".join(cells))


if __name__ == "__main__":
    main()
