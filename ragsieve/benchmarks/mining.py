"""Hard-negative mining for the base reranker: BM25 and MiniLM over each dataset's own pool.

For every train (and dev) question of a gold relevance source, the negatives are the
top non-gold passages of three rankings interleaved round-robin — MiniLM cosine over the
whole pool, BM25 over the whole pool, and the dataset's own candidate list where it has
one (HotpotQA's distractor paragraphs, the FEVER claim's document sentences). Each
passage keeps its MiniLM cosine, the teacher score the distillation term uses.

=========================  ============================================================
source                     held-out ranking set (unchanged; see :mod:`.relevance`)
=========================  ============================================================
``nq-oracle``              hybrid top-20, 200 questions
``hotpotqa-distractor``    the sample's 10 paragraphs, 50 questions (training uses the
                           1,517-question file minus every sample question)
``bioasq`` / ``fever``     BM25 top-20 / the claim documents' sentences, 200 each
``multirc`` / ``pubmedqa`` BM25 top-20 over the dataset's pool, 200 each
=========================  ============================================================

Train and held-out never meet: held-out = :func:`~ragsieve.benchmarks.relevance.split_questions`
(the same split as before), and a train question is dropped when one of its gold
passages is gold for a held-out question (MultiRC has ~11 questions per passage).

Each dataset is written to ``<work>/<name>.jsonl`` atomically and skipped when present,
so a killed run resumes where it stopped.

Example::

    mine_all(MiningConfig(), "results/rerank_base/work/mined")
    rows = read_mined("results/rerank_base/work/mined/fever.jsonl")
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ragsieve.config import StrictConfig
from ragsieve.data.records import Dataset, Passage, Question
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.benchmarks.relevance import RelevanceSource, default_sources, split_questions

log = logging.getLogger(__name__)

#: the training-only HotpotQA file (dev distractor setting, 1,517 questions)
HOTPOT_1517 = "hotpotqa/hotpot_dev_distractor_1517.jsonl.gz"

#: mined dataset → the dataset whose held-out split it must respect
SOURCES: tuple[str, ...] = ("nq-oracle", "hotpotqa-distractor", "fever", "bioasq", "multirc", "pubmedqa")


def held_out_sources() -> dict[str, RelevanceSource]:
    """The held-out evaluation sets: the existing four plus MultiRC and PubMedQA."""
    sources = default_sources()
    sources["multirc"] = RelevanceSource(test_questions=200)
    sources["pubmedqa"] = RelevanceSource(test_questions=200)
    return sources


def unseen_question_ids(name: str, ds: Dataset, seed: int = 0) -> set[str]:
    """Ids of the questions of ``ds`` (dataset ``name``) that the mined base reranker never trained
    (or early-stopped) on.

    Its held-out split for the six mined sources; every question of HotpotQA's 100-question
    sample (training mines the 1,517-question file minus them) and of any other dataset.
    """
    from ragsieve.data import held_out_questions

    if name not in SOURCES or name == "hotpotqa-distractor":
        return {q.id for q in ds.questions}
    with_gold = [q for q in ds.questions if q.gold_passage_ids]
    return {q.id for q in held_out_questions(with_gold, held_out_sources()[name].test_fraction, seed)}


def trained_question_ids(name: str, folder: str | Path, data_dir=None) -> set[str]:
    """Ids of dataset ``name``'s questions that the mined reranker in ``folder`` trained or early-stopped on.

    Recomputed from the recipe its card records (:func:`split_for_mining` is deterministic), so a
    study can keep them out of a test set without the git-ignored mined rows. Empty when the
    folder has no mining recipe or did not mine ``name``.

    Example::

        trained_question_ids("nq-oracle", "ragsieve/assets/base-reranker")   # 1,000 ids
    """
    from ragsieve.rerank.shipped import CARD

    card = Path(folder) / CARD
    params = (json.loads(card.read_text()).get("recipe") or {}).get("params", {}) if card.is_file() else {}
    if "mining" not in params or name not in params.get("datasets", SOURCES) or name not in SOURCES:
        return set()
    _, train, dev = split_for_mining(name, MiningConfig(**params["mining"]), data_dir)
    return {q.id for q in train + dev}


class MiningConfig(StrictConfig):
    train_questions: int = 325  # per dataset, dev included
    dev_questions: int = 25  # carved from the train questions, for early stopping
    depth: int = 30  # BM25 and MiniLM retrieval depth
    negatives: int = 15  # kept per question; training samples group_size-1 of them per pass
    # MiniLM encodes ≈750 tokens/s on a shared 2-core machine: the dense pool is capped, filled
    # with the mined questions' golds, own candidates and BM25 hits first, then a random sample
    pool_cap: int = 2500
    max_positives: int = 2
    encoder: str = DEFAULT_ENCODER
    seed: int = 0


def hotpot_1517(data_dir: str | Path | None = None) -> Dataset:
    """The 1,517-question HotpotQA distractor file as a Dataset (paragraph ids = titles).

    ``meta["candidate_ids"]`` is the question's own 10 (or fewer) paragraphs.
    """
    from ragsieve.data.loaders import default_data_dir

    path = Path(data_dir or default_data_dir()) / HOTPOT_1517
    if not path.exists():
        raise RagsieveError(f"{path} not found (the HotpotQA 1,517-question file)")
    pool: dict[str, Passage] = {}
    questions = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            cand = []
            for title, sents in row["context"]:
                pool.setdefault(title, Passage(title, "".join(sents).strip(), title))
                cand.append(title)
            gold = tuple(sorted({t for t, _ in row["supporting_facts"]} & set(cand)))
            questions.append(Question(row["_id"], row["question"], (row["answer"],), gold, {"candidate_ids": cand}))
    return Dataset("hotpotqa-distractor-1517", questions, list(pool.values()))


def split_for_mining(
    name: str, config: MiningConfig, data_dir=None
) -> tuple[Dataset, list[Question], list[Question]]:
    """(dataset to mine, train questions, dev questions) for one source; held-out ones excluded."""
    from ragsieve.data import load_dataset

    source = held_out_sources()[name]
    held_ds = load_dataset(name, data_dir=data_dir)
    wide = source.model_copy(update={"train_questions": 10**9})
    candidates, test = split_questions(held_ds, wide, config.seed)
    if name == "hotpotqa-distractor":
        # the sample's 100 questions (train half included) stay out: its held-out half is the test set
        mine_ds = hotpot_1517(data_dir)
        sample_ids = {q.id for q in held_ds.questions}
        candidates = [q for q in mine_ds.questions if q.id not in sample_ids and q.gold_passage_ids]
        import random

        random.Random(config.seed).shuffle(candidates)
    else:
        mine_ds = held_ds
    by_id = held_ds.passage_by_id()
    held_gold = {pid for q in test for pid in q.gold_passage_ids}
    held_texts = {by_id[pid].full_text for pid in held_gold if pid in by_id}
    mine_by_id = mine_ds.passage_by_id()
    # a question whose gold passage is a held-out question's gold would leak that passage
    candidates = [
        q for q in candidates
        if not any(mine_by_id[p].full_text in held_texts for p in q.gold_passage_ids if p in mine_by_id)
    ][: config.train_questions]
    if name == "hotpotqa-distractor":
        # pool = the chosen questions' paragraphs: encoding all 15k paragraphs costs ~10 min on 2 cores
        keep = {pid for q in candidates for pid in q.meta["candidate_ids"]}
        mine_ds = Dataset(mine_ds.name, candidates, [p for p in mine_ds.passages if p.id in keep])
    return mine_ds, candidates[config.dev_questions:], candidates[: config.dev_questions]


def _interleave(rankings: Sequence[tuple[str, Sequence[str]]], skip: set[str], limit: int) -> list[tuple[str, str]]:
    """Round-robin over named rankings: (passage id, ranking name) for the first ``limit`` new ids."""
    out: list[tuple[str, str]] = []
    seen = set(skip)
    pos = [0] * len(rankings)
    while len(out) < limit:
        progressed = False
        for k, (tag, ranking) in enumerate(rankings):
            while pos[k] < len(ranking) and ranking[pos[k]] in seen:
                pos[k] += 1
            if pos[k] < len(ranking) and len(out) < limit:
                seen.add(ranking[pos[k]])
                out.append((ranking[pos[k]], tag))
                progressed = True
        if not progressed:
            break
    return out


def _own_candidates(ds: Dataset, q: Question) -> list[str]:
    if "candidate_ids" in q.meta:
        return list(q.meta["candidate_ids"])
    if ds.name == "fever":
        from ragsieve.benchmarks.relevance import _fever_documents

        return [p.id for p in _fever_documents(ds, [q], 0)[0]]
    return []


def mine_dataset(
    ds: Dataset, train: Sequence[Question], dev: Sequence[Question], config: MiningConfig, encoder, work: Path
) -> list[dict]:
    """Mined rows for one dataset (see module doc); pool embeddings cached in ``work``."""
    from ragsieve.retrieve.bm25 import BM25Retriever

    passages = _capped_pool(ds, list(train) + list(dev), config)
    index = {p.id: i for i, p in enumerate(passages)}
    by_text: dict[str, list[str]] = {}
    for p in passages:
        by_text.setdefault(p.full_text, []).append(p.id)
    import hashlib

    # keyed on the exact pool, so a changed pool never reuses stale embeddings
    pool_key = hashlib.sha1("\x00".join(p.id for p in passages).encode()).hexdigest()[:10]
    emb_path = work / f"{ds.name}.{pool_key}.emb.npy"
    if emb_path.exists():
        emb = np.load(emb_path)
    else:
        emb = encoder.encode([p.full_text for p in passages], batch_size=64, normalize_embeddings=True)
        _atomic_save_npy(emb_path, emb)
    bm25 = BM25Retriever.build(passages)  # over the same (capped) pool, so every negative has a cosine
    rows = []
    for split, questions in (("train", train), ("dev", dev)):
        qemb = encoder.encode([q.text for q in questions], batch_size=64, normalize_embeddings=True)
        for q, qv in zip(questions, qemb):
            cos = emb @ qv
            gold = [g for g in q.gold_passage_ids if g in index]
            if not gold:
                continue
            # a non-gold passage with a gold passage's text is not a negative
            same_text = {pid for g in gold for pid in by_text[passages[index[g]].full_text]}
            dense = [passages[i].id for i in np.argsort(-cos)[: config.depth]]
            lexical = [h.passage.id for h in bm25.search(q.text, k=config.depth)]
            own = [p for p in _own_candidates(ds, q) if p in index]
            negs = _interleave([("own", own), ("dense", dense), ("bm25", lexical)], set(gold) | same_text, config.negatives)
            if not negs:
                continue
            # the best-scored golds first: a question with many gold snippets keeps its clearest ones
            gold = sorted(gold, key=lambda g: -cos[index[g]])[: config.max_positives]
            rows.append({
                "dataset": ds.name, "split": split, "qid": q.id, "query": q.text,
                "pos": [[g, passages[index[g]].full_text, float(cos[index[g]])] for g in gold],
                "neg": [[n, passages[index[n]].full_text, float(cos[index[n]]), tag] for n, tag in negs],
            })
    return rows


def _capped_pool(ds: Dataset, questions: Sequence[Question], config: MiningConfig) -> list[Passage]:
    """The whole pool if small, else golds, own candidates and BM25 hits of ``questions`` first."""
    import random

    from ragsieve.retrieve.bm25 import BM25Retriever

    passages = [p for p in ds.passages if p.text.strip()]
    if len(passages) <= config.pool_cap:
        return passages
    by_id = {p.id: p for p in passages}
    keep: dict[str, None] = {}
    # every gold if they take at most half the cap, else a few per question (BioASQ has ~15
    # each, which alone would fill the cap and silently drop the last questions' golds)
    per_question = None if sum(len(q.gold_passage_ids) for q in questions) <= config.pool_cap // 2 \
        else config.max_positives + 2
    for q in questions:
        keep.update((g, None) for g in sorted(q.gold_passage_ids)[:per_question] if g in by_id)
    for q in questions:
        keep.update((c, None) for c in _own_candidates(ds, q)[:10] if c in by_id)
    bm25 = BM25Retriever.build(passages)
    for q in questions:
        keep.update((h.passage.id, None) for h in bm25.search(q.text, k=10))
    chosen = list(keep)[: config.pool_cap]
    rest = [p.id for p in passages if p.id not in keep]
    random.Random(config.seed).shuffle(rest)
    chosen += rest[: max(0, config.pool_cap - len(chosen))]
    return [by_id[c] for c in chosen]


def mine_all(config: MiningConfig, work: str | Path, data_dir=None, names: Iterable[str] = SOURCES) -> dict[str, int]:
    """Mine every source into ``work/<name>.jsonl`` (skipping finished ones); rows per source."""
    from ragsieve.models.encoder import load_encoder

    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    encoder = None
    counts = {}
    for name in names:
        out = work / f"{name}.jsonl"
        if not out.exists():
            encoder = encoder or load_encoder(config.encoder)
            ds, train, dev = split_for_mining(name, config, data_dir)
            log.info("mining %s: %d train + %d dev questions over %d passages", name, len(train), len(dev),
                     len(ds.passages))
            rows = mine_dataset(ds, train, dev, config, encoder, work)
            tmp = out.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
            os.replace(tmp, out)
        counts[name] = sum(1 for _ in out.open())
    return counts


def mined_ids(row: dict) -> dict:
    """A mined row without its text (ids, MiniLM cosines, negative sources): safe to commit.

    :func:`mined_rows_from_ids` joins the text back from the datasets (mining is deterministic in
    :func:`split_for_mining`'s questions and pool, so the ids name the same texts on any machine).
    """
    return {"dataset": row["dataset"], "split": row["split"], "query_id": row["qid"],
            "pos_ids": [d[0] for d in row["pos"]], "pos_cosines": [d[2] for d in row["pos"]],
            "neg_ids": [d[0] for d in row["neg"]], "neg_cosines": [d[2] for d in row["neg"]],
            "neg_sources": [d[3] for d in row["neg"]]}


def mined_rows_from_ids(name: str, config: MiningConfig, records: Sequence[dict], data_dir=None) -> list[dict]:
    """The mined rows of source ``name`` rebuilt from :func:`mined_ids` records and the data (seconds, no MiniLM).

    Raises :class:`RagsieveError` (one line) when a recorded id is not in the data (another data version).

    Example::

        rows = mined_rows_from_ids("fever", MiningConfig(), read_id_records("records/mined", "fever"))
    """
    ds, train, dev = split_for_mining(name, config, data_dir)
    texts = {q.id: q.text for q in list(train) + list(dev)}
    passages = ds.passage_by_id()
    rows = []
    for r in records:
        missing = [r["query_id"]] * (r["query_id"] not in texts) + \
            [p for p in r["pos_ids"] + r["neg_ids"] if p not in passages]
        if missing:
            raise RagsieveError(f"{name}: recorded mined ids not in the data (e.g. {missing[:3]}); "
                                "delete the mined records to mine again")
        rows.append({
            "dataset": r["dataset"], "split": r["split"], "qid": r["query_id"], "query": texts[r["query_id"]],
            "pos": [[p, passages[p].full_text, c] for p, c in zip(r["pos_ids"], r["pos_cosines"])],
            "neg": [[p, passages[p].full_text, c, t]
                    for p, c, t in zip(r["neg_ids"], r["neg_cosines"], r["neg_sources"])],
        })
    return rows


def read_mined(path: str | Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def _atomic_save_npy(path: Path, arr: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, arr)
    os.replace(tmp, path)
