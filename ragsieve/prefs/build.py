"""Build the confidence-shift preference set (the paper's NQ_Rerank) from a dataset.

Per question: the top-``candidates`` retrieved passages, Inc(Q, C_i) = Conf(Q+C_i) − Conf(Q)
from the probe, then :func:`select_preferences`. Shifts are appended to
``shifts.jsonl`` per question as they are computed, so an interrupted build resumes
where it stopped; the train/test preference files are rewritten from it at the end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.prefs.preferences import PreferenceRecord, select_preferences, write_preferences


class PreferenceBuildConfig(StrictConfig):
    dataset: str = "nq-oracle"
    probe: str = "embedded:smollm2-nq"  # a probe folder or a shipped probe
    retriever: str = "hybrid"  # bm25 | dense | hybrid
    encoder: str = DEFAULT_ENCODER
    candidates: int = 20
    n_pos: int = 5
    n_neg: int = 5
    train_questions: int = 150
    test_questions: int = 60
    test_fraction: float = 0.2  # test questions come from held_out_questions(): never seen in training
    # or a probe study's split.json: train questions from its train + dev ids, test from its test ids,
    # so the preference test set and the RAG/CBDR tables share held-out questions the probe never saw
    split_file: str | None = None
    # the SQLite state cache: the probe run's (its states of Q and of Q + gold / top non-gold passage
    # are then read, not recomputed); None = the user cache
    state_cache: str | None = None
    seed: int = 0
    batch_size: int = 16
    questions_per_call: int = 4  # questions scored per probe call (4 × 21 prompts keeps batches full)
    data_dir: str | None = None


@dataclass
class QuestionShift:
    """What the probe said about one question's candidates (one line of shifts.jsonl)."""

    question_id: str
    split: str
    conf_q: float
    candidate_ids: list[str]
    inc: list[float]


def select_build_questions(cfg: PreferenceBuildConfig, questions, exclude_from_test=frozenset()) -> dict[str, list]:
    """Train questions from outside the held-out split (seeded order), test from inside it.

    With ``cfg.split_file`` the split is a probe study's: train from its ``train`` + ``dev``
    ids, test from its ``test`` ids (train in seeded order, test in file order), questions
    missing from the dataset skipped.
    """
    import random

    from ragsieve.data import held_out_questions, read_split_file

    if cfg.split_file:
        split = read_split_file(cfg.split_file, ("train", "test"))
        by_id = {q.id: q for q in questions}
        train = [by_id[i] for i in split["train"] + split.get("dev", []) if i in by_id]
        test = [by_id[i] for i in split["test"] if i in by_id]  # file order, as the RAG tables take them
    else:
        test = held_out_questions(questions, cfg.test_fraction, cfg.seed)
        test_ids = {q.id for q in test}
        train = [q for q in questions if q.id not in test_ids]
    random.Random(cfg.seed).shuffle(train)
    test = [q for q in test if q.id not in exclude_from_test]  # e.g. questions the start reranker trained on
    return {"train": train[: cfg.train_questions], "test": test[: cfg.test_questions]}


def state_cache_path(cfg: PreferenceBuildConfig) -> Path:
    """Where Conf() states are cached: ``cfg.state_cache`` or the user cache's ``states.sqlite``."""
    from ragsieve.paths import cache_dir

    return Path(cfg.state_cache) if cfg.state_cache else cache_dir() / "states.sqlite"


def build_preference_set(
    cfg: PreferenceBuildConfig, out_dir: str | Path, progress: Callable[[int], None] | None = None,
    exclude_from_test=frozenset(), commit_dir: str | Path | None = None,
) -> dict:
    """Write ``shifts.jsonl``, ``prefs_train.jsonl``, ``prefs_test.jsonl``; return counts.

    With ``commit_dir`` (a study's committed ``prefs/``; ``out_dir`` is then its git-ignored work
    folder) a copy fit to commit is written there too: ``shifts.jsonl`` as is (ids and scores) and
    the preference files stripped of their dataset text. A fresh clone starts from that copy's
    shifts, so the preference files are rebuilt from the dataset without a probe pass.

    Example::

        build_preference_set(PreferenceBuildConfig(train_questions=20, test_questions=5), "prefs/")
    """
    from ragsieve.data import append_jsonl, load_dataset, read_jsonl
    from ragsieve.models import load_local_llm
    from ragsieve.probe.cache import StateCache
    from ragsieve.probe.model import ConfidenceProbe, load_head
    from ragsieve.retrieve.cached import build_or_load_index

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    ds = load_dataset(cfg.dataset, data_dir=cfg.data_dir)
    splits = select_build_questions(cfg, ds.questions, exclude_from_test)
    shifts_path = out_dir / "shifts.jsonl"
    if commit_dir and not shifts_path.exists() and (Path(commit_dir) / "shifts.jsonl").is_file():
        import shutil

        shutil.copyfile(Path(commit_dir) / "shifts.jsonl", shifts_path)
    done = {row["question_id"]: QuestionShift(**row) for row in read_jsonl(shifts_path, skip_bad=True)} \
        if shifts_path.exists() else {}

    # test first: a build stopped early still has a complete test set to evaluate on
    todo = [(name, q) for name in ("test", "train") for q in splits[name] if q.id not in done]
    if progress:
        progress(sum(len(qs) for qs in splits.values()) - len(todo))
    if todo:
        if not (Path(cfg.probe) / "probe_config.json").exists():
            raise RagsieveError(f"no probe at {cfg.probe}: run experiments/probe_nq.yaml first")
        probe_config, _ = load_head(cfg.probe)
        llm = load_local_llm(probe_config.llm_spec)
        cache = StateCache(state_cache_path(cfg))
        probe = ConfidenceProbe.load(cfg.probe, llm, batch_size=cfg.batch_size, cache=cache)
        retriever, _ = build_or_load_index(cfg.dataset, ds.passages, cfg.retriever, cfg.encoder)
        for lo in range(0, len(todo), cfg.questions_per_call):
            chunk = todo[lo : lo + cfg.questions_per_call]
            hits = retriever.search_batch([q.text for _, q in chunk], k=cfg.candidates)
            questions, contexts = [], []
            for (_, q), row in zip(chunk, hits):
                questions += [q.text] * (len(row) + 1)
                contexts += [None] + [h.passage for h in row]
            conf = probe.score_batch(questions, contexts)
            at = 0
            rows = []
            for (name, q), row in zip(chunk, hits):
                scores = conf[at : at + len(row) + 1]
                at += len(row) + 1
                shift = QuestionShift(q.id, name, float(scores[0]), [h.passage.id for h in row],
                                      [float(s - scores[0]) for s in scores[1:]])
                rows.append(asdict(shift))
                done[q.id] = shift
            for row in rows:  # fsync'd: a crash loses at most this chunk
                append_jsonl(shifts_path, row)
            if progress:
                progress(len(chunk))
        cache.close()
    stats = write_preference_splits(ds, splits, done, cfg, out_dir)
    if commit_dir:
        import shutil

        Path(commit_dir).mkdir(parents=True, exist_ok=True)
        if shifts_path.exists():
            shutil.copyfile(shifts_path, Path(commit_dir) / "shifts.jsonl")
        write_preference_splits(ds, splits, done, cfg, Path(commit_dir), stripped=True)
    return stats


def write_preference_splits(ds, splits: dict[str, list], shifts: dict[str, QuestionShift], cfg, out_dir: Path,
                            stripped: bool = False) -> dict:
    """Select pos/neg per question, write both jsonl files (``stripped``: without the dataset text, see
    :func:`~ragsieve.prefs.preferences.write_preferences`), and count what was kept."""
    by_id = ds.passage_by_id()
    stats: dict[str, dict] = {}
    for name, questions in splits.items():
        records: list[PreferenceRecord] = []
        dropped = {"no_positive": 0, "no_negative": 0}
        gold_retrieved = gold_positive = gold_negative = 0
        for q in questions:
            shift = shifts[q.id]
            cands = [by_id[pid] for pid in shift.candidate_ids]
            rec = select_preferences(q.text, cands, shift.inc, n_pos=cfg.n_pos, n_neg=cfg.n_neg, question_id=q.id)
            gold = set(q.gold_passage_ids)
            gold_retrieved += bool(gold & set(shift.candidate_ids))
            if rec is None:
                inc = np.asarray(shift.inc)
                dropped["no_positive" if not (inc > 0).any() else "no_negative"] += 1
                continue
            gold_positive += bool(gold & set(rec.pos_ids))
            gold_negative += bool(gold & set(rec.neg_ids))
            records.append(rec)
        write_preferences(out_dir / f"prefs_{name}.jsonl", records, dataset=cfg.dataset if stripped else None)
        n = len(questions)
        all_inc = np.concatenate([shifts[q.id].inc for q in questions]) if questions else np.zeros(0)
        stats[name] = {
            "questions": n,
            "kept": len(records),
            "dropped": dropped,
            "positives": sum(len(r.pos) for r in records),
            "negatives": sum(len(r.neg) for r in records),
            "gold_retrieved_rate": gold_retrieved / max(n, 1),
            # how often the gold passage is among the kept positives / negatives
            "gold_is_positive_rate": gold_positive / max(len(records), 1),
            "gold_is_negative_rate": gold_negative / max(len(records), 1),
            "inc_positive_fraction": float((all_inc > 0).mean()) if all_inc.size else 0.0,
            "inc_mean": float(all_inc.mean()) if all_inc.size else 0.0,
        }
    return stats
