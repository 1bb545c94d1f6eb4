"""Phase 7 of ``ragsieve fit``: the reranker aligned to the LLM, fine-tuned on the preference groups.

Reads ``prefs`` and the candidates; trains from ``align.init`` into ``<out>/reranker`` (atomically: a killed
training leaves nothing behind) and, with ``align.guard``, checks it ranks the dev candidates that contain an
answer no worse (MRR@10, paired bootstrap) than the reranker it started from. The verdict is written to
``<work>/align_check.json`` (and ``<records>/align_check.json`` with the key of the preferences and settings);
a rejected reranker moves to ``<work>/reranker-rejected``. ``<work>/align_key.txt`` stamps the preferences and
settings the folder was trained on: when they change, the reranker is trained again; when not, a resumed fit
keeps the verdict. The state gets ``reranker_spec`` (``reranker``, or ``align.init`` when not kept) and
``align_check``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ragsieve.atomic import write_json_atomic

if TYPE_CHECKING:
    from ragsieve.fit.state import FitState

log = logging.getLogger(__name__)


def align_reranker(state: "FitState") -> None:
    target = state.out / "reranker"
    check_file = state.work / "align_check.json"
    state.reranker_spec = "reranker"
    state.align_check = None
    key = _forget_stale_alignment(state, target, check_file)
    record = state.records / "align_check.json" if state.records else None
    if not check_file.is_file() and record is not None and record.is_file():
        recorded = json.loads(record.read_text())
        # rejected on another machine for these preferences and settings: that decision needs no weights
        if recorded.pop("align_key", None) == key and not recorded["kept"]:
            write_json_atomic(check_file, recorded)
    if check_file.is_file():  # trained and checked before: the decision stands
        state.align_check = json.loads(check_file.read_text())
        if not state.align_check["kept"]:
            state.reranker_spec = state.config.align.init
        state.progress("rerank", 1, 1)  # a resumed run's log still shows the phase
        return
    if not (target / "config.json").is_file():
        if len(state.prefs["train"]) < 2:
            log.warning("fit: %d preference group(s): too few to align, the sieve keeps %s",
                        len(state.prefs["train"]), state.config.align.init)
            state.reranker_spec = state.config.align.init
            return
        _train(state, target)
    if state.config.align.guard:
        _guard(state, target)
        write_json_atomic(check_file, state.align_check)
        if record is not None:
            write_json_atomic(record, {**state.align_check, "align_key": key})
    state.progress("rerank", 1, 1)


def _train(state: "FitState", target: Path) -> None:
    """The reranker fine-tuned on the train preference groups into ``target``, with the forgetting guards."""
    from ragsieve.atomic import atomic_directory
    from ragsieve.registry import reranker_folder
    from ragsieve.rerank.training.trainer import train_cross_encoder

    a = state.config.align
    t = a.train
    init = reranker_folder(a.init, "align.init")
    # the forgetting guards (issue #18): gold groups are the candidates that contain an answer
    replay = gold_groups(state, "train") if t.replay_ratio > 0 else None
    # early stopping reads dev, which the relevance check reads too: it favours passing it
    dev = gold_groups(state, "dev") if t.eval_steps > 0 else None
    replay_ratio = t.replay_ratio if replay else 0.0
    eval_steps = t.eval_steps if dev else 0
    if t.replay_ratio > 0 and not replay:
        log.warning("fit: no train question has an answer-bearing and another candidate: no replay")
    if t.eval_steps > 0 and not dev:
        log.warning("fit: no dev question has an answer-bearing and another candidate: no early stopping")
    config = a.train.model_copy(update={"init": init, "group_size": 1 + a.n_neg, "seed": state.config.seed,
                                        "replay_ratio": replay_ratio, "eval_steps": eval_steps})
    with atomic_directory(target) as tmp:  # a killed training leaves nothing half-written behind
        train_cross_encoder(state.prefs["train"], config, tmp, replay=replay, relevance_dev=dev)
        shutil.rmtree(tmp / "checkpoints", ignore_errors=True)


def _guard(state: "FitState", target: Path) -> None:
    """The relevance check's verdict on ``target``; a rejected reranker is moved aside and the start one kept."""
    state.align_check = _relevance_check(state)
    if not state.align_check["kept"]:
        log.warning("fit: the aligned reranker ranks answer-bearing dev passages %.3f MRR@10 below %s; "
                    "the sieve keeps %s", -state.align_check["diff"], state.config.align.init,
                    state.config.align.init)
        shutil.rmtree(state.work / "reranker-rejected", ignore_errors=True)
        shutil.move(str(target), str(state.work / "reranker-rejected"))  # kept for inspection, not shipped
        state.reranker_spec = state.config.align.init


def gold_groups(state: "FitState", split: str) -> list:
    """Relevance groups of ``split``: a question's answer-bearing candidates vs its other candidates."""
    from ragsieve.prefs.preferences import PreferenceRecord

    groups = []
    for q in state.splits[split]:
        cands, bearing = state.candidates[q.id], state.answer_bearing(q)
        pos = [p for i, p in enumerate(cands) if i in bearing]
        neg = [p for i, p in enumerate(cands) if i not in bearing]
        if pos and neg:
            groups.append(PreferenceRecord(q.text, [p.full_text for p in pos], [p.full_text for p in neg],
                                           [1.0] * len(pos), [0.0] * len(neg), q.id,
                                           [p.id for p in pos], [p.id for p in neg]))
    return groups


def _forget_stale_alignment(state: "FitState", target: Path, check_file: Path) -> str:
    """A reranker trained on other preferences or settings is not resumed: it is trained again.
    Returns the key of the current preferences and settings."""
    records = [[r.query_id, r.pos_ids, r.neg_ids] for r in state.prefs["train"]]
    key = hashlib.sha1(json.dumps([records, state.config.align.model_dump()], sort_keys=True).encode()).hexdigest()
    stamp = state.work / "align_key.txt"
    if stamp.is_file() and stamp.read_text().strip() == key:
        return key
    if target.exists() or check_file.exists():
        log.info("fit: preferences or align settings changed; training the reranker again")
    shutil.rmtree(target, ignore_errors=True)
    shutil.rmtree(state.work / "reranker-rejected", ignore_errors=True)
    check_file.unlink(missing_ok=True)
    stamp.write_text(key + "\n")
    return key


def _relevance_check(state: "FitState") -> dict:
    """MRR@10 of the dev candidates that contain a gold answer: the aligned folder vs the reranker it started
    from, per question, with a paired bootstrap; ``kept`` says whether alignment may stay."""
    from ragsieve.eval.stats import paired_bootstrap

    qs = [q for q in state.splits["dev"] if state.answer_bearing(q)]
    if len(qs) < 5:
        return {"kept": True, "n": len(qs), "why": "fewer than 5 dev questions with an answer-bearing candidate"}

    def reciprocal_ranks(spec: str) -> list[float]:
        out = []
        for q in qs:
            order = [idx for idx, _ in state.rankings.ranked(spec, q)][:10]
            first = next((rank for rank, idx in enumerate(order) if idx in state.answer_bearing(q)), None)
            out.append(0.0 if first is None else 1.0 / (first + 1))
        return out

    init = state.config.align.init
    state.rankings.rank_all(["reranker", init], qs, "rerank")
    aligned_rr = reciprocal_ranks("reranker")  # the folder ``<out>/reranker``, before the verdict moves it
    base_rr = reciprocal_ranks(init)
    result = paired_bootstrap(aligned_rr, base_rr).to_dict()
    worse = result["diff"] < -state.config.align.max_mrr_drop or result["high"] < 0
    return {**result, "metric": "MRR@10 of answer-bearing dev candidates", "aligned_mrr": result["a"],
            "start_mrr": result["b"], "start": init, "kept": not worse,
            "max_mrr_drop": state.config.align.max_mrr_drop}
