"""Binary verdict tasks from the benchmark loaders, split into an SFT set and rounds.

One example is a (query, passage) pair with a 0/1 label and the fields its dataset's
template needs (see ``verdicts.yaml``):

* ``anli``: premise / hypothesis, 1 = entailment, 0 = neutral or contradiction
* ``fever``: claim / evidence, 1 = SUPPORTS, 0 = REFUTES (the ERASER set has no NEI)
* ``pubmedqa``: question / abstract, 1 = yes, 0 = no ("maybe" is dropped by the loader)
* ``hotpotqa-distractor``: question / sentence, 1 = the sentence is a supporting fact
* ``bioasq``: question / snippet, 1 = a gold snippet of this question, 0 = the BM25-closest
  snippet that is gold for another question only (a realistic hard negative)
* ``multirc``: passage / question + candidate answer, the answer's label (val split)

Rounds: BioASQ keeps its natural batches (7B = the SFT set, then 8B, 9B, 10B, 11B = rounds
1-4); the others order their examples by a seeded hash of the id
(:func:`ragsieve.data.splits.id_unit`) and cut the SFT set and then each round in turn.
With ``balanced=True`` every split takes half positives, half negatives (HotpotQA has
~6 % positives, so unbalanced rounds would reward "always False").

Test set (``test_size``): whole queries, in seeded query-id order, are moved out of the pool
before anything else is cut, until each label has its quota (half each when
``balanced_test``); so the test set shares no query id with the SFT set or any round (a
BioASQ question's positive and negative snippet, or a MultiRC passage's other answers, never
straddle the split). BioASQ's test queries come from all its batches.

HotpotQA has two sources (``hotpot_source``): ``sample100`` (the 100-question file, 249
supporting sentences: too few for rounds of 200) and ``all``, which adds the 1,517-question
dev distractor file (25 questions shared, kept once; 3,728 supporting facts).

Example::

    task = build_task_rounds("pubmedqa", initial_size=128, round_size=64)
    len(task.initial), [len(r) for r in task.rounds]   # 128, [64, 64, 64, 64]
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ragsieve.data.records import Dataset, LabeledPair
from ragsieve.data.splits import id_unit
from ragsieve.errors import DataError


@dataclass
class TaskRounds:
    """A dataset cut for the multi-round protocol."""

    dataset: str
    initial: list[LabeledPair]
    rounds: list[list[LabeledPair]]
    held_out_query_ids: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    test: list[LabeledPair] = field(default_factory=list)  # fixed, query-disjoint from every split
    held_out: list[LabeledPair] = field(default_factory=list)  # the examples of held_out_query_ids
    # Examples left after the test set, M0's set and the rounds were cut (a dev set comes from these).
    unused: list[LabeledPair] = field(default_factory=list)

    def sizes(self) -> dict[str, Any]:
        def count(xs: Sequence[LabeledPair]) -> dict[str, int]:
            return {"n": len(xs), "positives": sum(x.label for x in xs)}

        out = {"initial": count(self.initial), "rounds": [count(r) for r in self.rounds]}
        if self.test:
            out["test"] = count(self.test)
        return out

    def splits(self) -> list[list[LabeledPair]]:
        """Split s = 0 (the SFT set), 1..R (the rounds): what M_t has been trained on for s <= t."""
        return [self.initial, *self.rounds]


# --------------------------------------------------------------------------- per-dataset examples


def _from_pairs(ds: Dataset, fields_of: Callable[[Any], dict[str, str]], group: str | None = None) -> list[LabeledPair]:
    return [
        dataclasses.replace(p, label=int(p.label), fields=fields_of(p), dataset=ds.name)
        for p in ds.pairs
        if group is None or p.group == group
    ]


def _anli(ds: Dataset) -> list[LabeledPair]:
    return _from_pairs(ds, lambda p: {"premise": p.fields["premise"], "hypothesis": p.fields["hypothesis"]})


def _fever(ds: Dataset) -> list[LabeledPair]:
    return _from_pairs(ds, lambda p: {"claim": p.fields["claim"], "evidence": p.fields["evidence"]})


def _pubmedqa(ds: Dataset) -> list[LabeledPair]:
    return _from_pairs(ds, lambda p: {"question": p.fields["question"], "context": p.fields["context"]})


def _hotpotqa(ds: Dataset) -> list[LabeledPair]:
    out = _from_pairs(ds, lambda p: {"question": p.fields["question"], "sentence": p.fields["sentence"]})
    return [x for x in out if x.fields["sentence"].strip()]


HOTPOT_1517 = "hotpotqa/hotpot_dev_distractor_1517.jsonl.gz"
HOTPOT_SOURCES = ("sample100", "all")


def _hotpot_1517_rows(data_dir: str | None) -> list[dict[str, Any]]:
    """The 1,517-question file's rows (original HotpotQA structure: ``_id``, ``context[[title, sents]]``)."""
    import gzip
    import json
    from pathlib import Path

    from ragsieve.data.loaders import default_data_dir

    path = Path(data_dir) if data_dir else default_data_dir()
    path = path / HOTPOT_1517
    if not path.is_file():
        raise DataError(f"{path} not found (the 1,517-question HotpotQA file); use hotpot_source: sample100")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def hotpot_questions(data_dir: str | None = None, source: str = "sample100") -> dict[str, Any]:
    """HotpotQA distractor questions by id (answers, ``meta["candidate_ids"]`` = paragraph titles)
    and their sentence pairs, from the configured source (see the module doc)."""
    from ragsieve.data import load_dataset
    from ragsieve.data.records import Question

    if source not in HOTPOT_SOURCES:
        raise DataError(f"hotpot_source must be one of {', '.join(HOTPOT_SOURCES)}, got '{source}'")
    ds = load_dataset("hotpotqa-distractor", data_dir=data_dir)
    questions = {q.id: q for q in ds.questions}
    pairs = _hotpotqa(ds)
    if source == "all":
        for row in _hotpot_1517_rows(data_dir):
            qid = str(row["_id"])
            if qid in questions:  # 25 questions are in both files: keep the sample100 copy
                continue
            titles = [title for title, _ in row["context"]]
            support = {(title, int(i)) for title, i in row["supporting_facts"]}
            questions[qid] = Question(qid, row["question"], (str(row["answer"]),), meta={"candidate_ids": titles})
            for pi, (title, sents) in enumerate(row["context"]):
                for si, sent in enumerate(sents):
                    if sent.strip():
                        fields = {"question": row["question"], "sentence": sent.strip()}
                        pairs.append(LabeledPair(f"{qid}:{pi}:{si}", qid, row["question"], sent.strip(),
                                                 int((title, si) in support), fields, dataset=ds.name))
    return {"questions": questions, "pairs": pairs}


def _multirc(ds: Dataset) -> list[LabeledPair]:
    # The template has no answer slot: {question} carries "question + candidate answer" (LabeledPair.query).
    return _from_pairs(ds, lambda p: {"passage": p.fields["passage"], "question": p.query}, group="val")


_BIOASQ_YEAR = re.compile(r"^(\d+)B")


def _bioasq(ds: Dataset) -> list[LabeledPair]:
    """One positive (a gold snippet) and one hard negative per question, grouped by year."""
    from ragsieve.retrieve.bm25 import BM25Retriever

    passages = ds.passage_by_id()
    retriever = BM25Retriever.build(ds.passages)
    out: list[LabeledPair] = []
    for q in ds.questions:
        gold = [pid for pid in q.gold_passage_ids if pid in passages]
        if not gold:
            continue
        match = _BIOASQ_YEAR.match(str(q.meta.get("batch", "")))
        year = match[1] if match else "?"
        positive = min(gold, key=lambda pid: (id_unit(pid), pid))
        # Every pool snippet is gold for some question, so the best non-gold hit is a snippet
        # retrieved for another question: lexically close, judged irrelevant to this one.
        golds = set(gold)
        negative = next((h.passage.id for h in retriever.search(q.text, k=20) if h.passage.id not in golds), None)
        if negative is None:
            negative = _hashed_first([p.id for p in ds.passages if p.id not in golds], f"{q.id}:")
        for suffix, pid, label in (("pos", positive, 1), ("neg", negative, 0)):
            text = passages[pid].text
            out.append(
                LabeledPair(
                    f"{q.id}:{suffix}", q.id, q.text, text, label,
                    {"question": q.text, "content": text}, group=year, dataset=ds.name,
                )
            )
    return out


def _hashed_first(ids: Sequence[str], prefix: str) -> str:
    """``min(ids, key=lambda i: (id_unit(prefix + i), i))``, hashing the shared prefix once: a question's pick
    among every pool snippet (thousands of hashes a question)."""
    base = hashlib.sha256(f"0:{prefix}".encode("utf-8"))  # id_unit's "{salt}{seed}:" with seed 0, no salt

    def key(id_: str) -> tuple[float, str]:
        h = base.copy()
        h.update(id_.encode("utf-8"))
        return int.from_bytes(h.digest()[:8], "big") / 2.0**64, id_

    return min(ids, key=key)


#: dataset name → builder of its examples from the loaded :class:`Dataset`.
TASKS: dict[str, Callable[[Dataset], list[LabeledPair]]] = {
    "anli": _anli,
    "fever": _fever,
    "pubmedqa": _pubmedqa,
    "hotpotqa-distractor": _hotpotqa,
    "bioasq": _bioasq,
    "multirc": _multirc,
}

#: datasets whose rounds are natural batches (``group``) rather than hash order.
NATURAL_ROUNDS: dict[str, tuple[str, ...]] = {"bioasq": ("7", "8", "9", "10", "11")}


def task_examples(dataset: str, data_dir: str | None = None, hotpot_source: str = "sample100") -> list[LabeledPair]:
    """Every example of ``dataset``'s binary task."""
    from ragsieve.data import load_dataset

    try:
        builder = TASKS[dataset]
    except KeyError:
        raise DataError(f"no verdict task for dataset '{dataset}'; known: {', '.join(sorted(TASKS))}") from None
    if dataset == "hotpotqa-distractor" and hotpot_source != "sample100":
        return hotpot_questions(data_dir, hotpot_source)["pairs"]
    return builder(load_dataset(dataset, data_dir=data_dir))


# --------------------------------------------------------------------------- splitting


def _ordered(examples: Sequence[LabeledPair], seed: int) -> list[LabeledPair]:
    return sorted(examples, key=lambda x: (id_unit(x.id, seed), x.id))


class _Cutter:
    """Cuts consecutive splits off a seeded order, per class when balanced."""

    def __init__(self, examples: Sequence[LabeledPair], seed: int, balanced: bool, dataset: str):
        self.dataset = dataset
        self.balanced = balanced
        self.seed = seed
        ordered = _ordered(examples, seed)
        self.queues = {1: [x for x in ordered if x.label], 0: [x for x in ordered if not x.label]} if balanced else {
            -1: ordered
        }

    def take(self, size: int, what: str) -> list[LabeledPair]:
        if not self.balanced:
            queue = self.queues[-1]
            if len(queue) < size:
                raise DataError(f"{self.dataset}: {what} needs {size} examples, only {len(queue)} left")
            out, self.queues[-1] = queue[:size], queue[size:]
            return out
        n_pos = size // 2
        want = {1: n_pos, 0: size - n_pos}
        for label, n in want.items():
            if len(self.queues[label]) < n:
                raise DataError(
                    f"{self.dataset}: {what} needs {n} examples with label {label}, only "
                    f"{len(self.queues[label])} left; lower initial_size / round_size"
                )
        out = []
        for label, n in want.items():
            out += self.queues[label][:n]
            self.queues[label] = self.queues[label][n:]
        # Interleave classes in hash order so a truncated round is still mixed.
        return _ordered(out, self.seed)


def select_test(
    items: Sequence[LabeledPair], size: int, seed: int, balanced: bool, dataset: str, what: str = "test set"
) -> tuple[list[LabeledPair], set[str]]:
    """A test set of whole queries (seeded query order) and every query id it used up.

    Queries are taken until each label has its quota (``size // 2`` positives and the rest
    negatives when ``balanced``, else ``size`` examples). The other examples of a query with
    a test example are dropped rather than left in the pool, so no query straddles the split;
    a query none of whose examples made it in (its label's quota was full) goes back.
    """
    by_query: dict[str, list[LabeledPair]] = {}
    for x in items:
        by_query.setdefault(x.query_id, []).append(x)
    # a different salt than the held-out questions' order, so the two never coincide
    order = sorted(by_query, key=lambda q: (id_unit(f"test:{q}", seed), q))
    want = {1: size // 2, 0: size - size // 2} if balanced else {-1: size}
    got: dict[int, list[LabeledPair]] = {k: [] for k in want}
    for q in order:
        if all(len(got[k]) >= n for k, n in want.items()):
            break
        for x in _ordered(by_query[q], seed):
            key = int(x.label) if balanced else -1
            if key in got and len(got[key]) < want[key]:
                got[key].append(x)
    short = {k: (len(got[k]), n) for k, n in want.items() if len(got[k]) < n}
    if short:
        raise DataError(
            f"{dataset}: {what} of {size} needs more examples than the data has ({short}); lower its size"
        )
    test = [x for k in want for x in got[k]]
    return _ordered(test, seed), {x.query_id for x in test}


def build_task_rounds(
    dataset: str,
    *,
    initial_size: int,
    round_size: int,
    rounds: int = 4,
    seed: int = 0,
    balanced: bool = True,
    held_out_queries: int = 0,
    test_size: int = 0,
    balanced_test: bool = True,
    hotpot_source: str = "sample100",
    data_dir: str | None = None,
    examples: Sequence[LabeledPair] | None = None,
) -> TaskRounds:
    """The SFT set and ``rounds`` sequential batches of ``dataset`` (see the module doc).

    ``held_out_queries`` removes the first N query ids (seeded order) from every split and
    returns them, e.g. HotpotQA questions kept for the downstream QA evaluation.
    ``test_size`` carves a fixed query-disjoint test set first (``TaskRounds.test``).
    ``examples`` skips loading (tests pass their own).
    """
    if initial_size < 2 or round_size < 2 or rounds < 1:
        raise DataError(f"need initial_size >= 2, round_size >= 2 and rounds >= 1 (got {initial_size}, {round_size}, {rounds})")
    items = list(examples) if examples is not None else task_examples(dataset, data_dir, hotpot_source)
    query_ids = sorted({x.query_id for x in items}, key=lambda q: (id_unit(q, seed), q))
    held_out = query_ids[:held_out_queries] if held_out_queries else []
    held_out_examples: list[LabeledPair] = []
    if held_out:
        skip = set(held_out)
        held_out_examples = [x for x in items if x.query_id in skip]
        items = [x for x in items if x.query_id not in skip]
    test: list[LabeledPair] = []
    if test_size:
        test, used = select_test(items, test_size, seed, balanced_test, dataset)
        items = [x for x in items if x.query_id not in used]

    groups = NATURAL_ROUNDS.get(dataset)
    if groups is not None and examples is None:
        if rounds > len(groups) - 1:
            raise DataError(f"{dataset} has {len(groups) - 1} natural rounds after its SFT batch, asked for {rounds}")
        by_group = {g: [x for x in items if x.group == g] for g in groups}
        initial = _Cutter(by_group[groups[0]], seed, balanced, dataset).take(initial_size, f"SFT set ({groups[0]}B)")
        cut = [
            _Cutter(by_group[g], seed, balanced, dataset).take(round_size, f"round {i} ({g}B)")
            for i, g in enumerate(groups[1 : rounds + 1], start=1)
        ]
        how = f"natural batches: SFT = {groups[0]}B, rounds = " + ", ".join(f"{g}B" for g in groups[1 : rounds + 1])
    else:
        cutter = _Cutter(items, seed, balanced, dataset)
        initial = cutter.take(initial_size, "SFT set")
        cut = [cutter.take(round_size, f"round {i}") for i in range(1, rounds + 1)]
        how = f"seeded id order (seed {seed})"
    taken = {x.id for split in (initial, *cut) for x in split}
    task = TaskRounds(
        dataset, initial, cut, held_out, {"split": how, "balanced": balanced, "available": len(items)},
        test=test, held_out=held_out_examples, unused=[x for x in items if x.id not in taken],
    )
    task.meta["sizes"] = task.sizes()
    return task


def select_dev(task: TaskRounds, size: int, seed: int = 0) -> list[LabeledPair]:
    """A balanced dev set of whole queries from ``task.unused``, sharing no query with the test set,
    M0's set or any round: for choosing settings (M0's recipe) without touching the test set, and
    without the rounds' labels, which CautiousDPO must not see."""
    used = {x.query_id for split in task.splits() for x in split} | {x.query_id for x in task.test}
    pool = [x for x in task.unused if x.query_id not in used]
    dev, _ = select_test(pool, size, seed, True, task.dataset, what="dev set")
    return dev
