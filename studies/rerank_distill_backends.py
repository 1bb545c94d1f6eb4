"""The teacher itself on faster forwards and longer windows: ``teacher@<backends>``, ``teacher@window<N>``,
``teacher@best-chunk``.

One of the three studies ``experiments/rerank_distill.yaml`` runs (beside :mod:`studies.rerank_distill` and
:mod:`studies.rerank_distill_calibration`). The shipped mix (cross-encoder logit + weighted MiniLM cosine) is
scored on other backends (``teacher_backends``: "<cross-encoder backend>+<cosine backend>"), with a longer
cross-encoder window (``teacher_windows``) and by its best window-sized chunk (``teacher_best_chunk``), as rows
of the distillation's held-out evaluation (:func:`teacher_variants`). The fastest backend pair shown within
``backend_tolerance`` of the fp32 teacher on every set and not measurably below cosine (:func:`backend_verdict`)
is written into the shipped card (:func:`choose_backends`); windows and chunks are reported, never shipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from ragsieve.atomic import atomic_file
from ragsieve.rerank.base import BaseRanker
from studies.rerank_distill_common import (CROSS_ALONE, Remembered, cell_diff, cell_interval, cell_mean, shortfall,
                                           teacher_identity)

if TYPE_CHECKING:
    from studies.rerank_distill import RerankDistillConfig

BEST_CHUNK = "teacher@best-chunk"


def window_key(window: int) -> str:
    """The evaluation row of the teacher (its shipped backends) with a ``window``-token cross-encoder."""
    return f"teacher@window{window}"


def variant_key(backends: str) -> str:
    """The evaluation row of the teacher on ``"<cross-encoder backend>+<cosine backend>"``."""
    return f"teacher@{backends}"


def backend_verdict(by_dataset: dict[str, dict], backends: str, tolerance: float) -> dict:
    """Whether the teacher on ``backends`` keeps its own quality: shown within ``tolerance`` on every set (the
    paired interval's low end clears ``-tolerance``: "met"), and not measurably below cosine (:func:`shortfall`).
    Stricter than a student's point-estimate rule: a backend swap promises the same scores, so it must show it."""
    from ragsieve.eval.stats import MET, target_verdict

    key = variant_key(backends)
    per_set = {name: target_verdict(rows[key]["vs_teacher"]["diff"], rows[key]["vs_teacher"]["low"],
                                    rows[key]["vs_teacher"]["high"], -tolerance) for name, rows in by_dataset.items()}
    unshown = []
    for name, verdict in per_set.items():
        d = by_dataset[name][key]["vs_teacher"]
        if verdict != MET:
            unshown.append(f"{name} {d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]")
    why = "; ".join(filter(None, [f"not shown within {tolerance} of the teacher on {', '.join(unshown)}" if unshown
                                  else "", shortfall(by_dataset, key, float("inf"))]))  # inf: the cosine check only
    return {"ship": not why, "why": why or "within target", "per_set": per_set}


def teacher_variants(cfg: "RerankDistillConfig", teacher: Path, queries, mix, calibration,
                     remembered: dict[str, BaseRanker]) -> dict[str, Remembered]:
    """The teacher's evaluation rows on other forwards: each of ``cfg.teacher_backends`` (:func:`variant_key`),
    each of ``cfg.teacher_windows`` (:func:`window_key`) and, with ``cfg.teacher_best_chunk``, :data:`BEST_CHUNK`.

    ``mix`` is the teacher's cosine mix over ``queries``' candidates, ``calibration`` the shipped one, and
    ``remembered`` the reference rows already built: its ``cosine`` (MiniLM on torch) and :data:`CROSS_ALONE`
    (the fp32 cross-encoder's logit, read as the recorded mix minus its cosine term: no forward) are reused.
    """
    from ragsieve.rerank.mixed import CosineMixRanker
    from ragsieve.rerank.shipped import load_shipped_reranker
    from studies.rerank_base import CosineOverCandidates

    out: dict[str, Remembered] = {}
    cosines = {"torch": remembered["cosine"]}  # one encoding of the candidates per cosine backend
    for backends in cfg.teacher_backends:
        cross_backend, cosine_backend = backends.split("+")
        # the fp32 cross-encoder's logit is the recorded mix minus its cosine term: no forward
        cross = remembered[CROSS_ALONE] if cross_backend == "torch" else load_shipped_reranker(
            teacher, backend=cross_backend).cross
        cos = cosines.setdefault(cosine_backend, CosineOverCandidates(cfg.encoder, queries, cosine_backend))
        key = variant_key(backends)  # remembered: nDCG and ECE read one pass of the forwards
        variant = CosineMixRanker(cross, mix.weight, mix.scale, cosine=cos)  # the shipped mix, its parts
        variant.calibration = calibration
        out[key] = Remembered(variant, key)
    for window in cfg.teacher_windows:
        shipped_backends = load_shipped_reranker(teacher, max_length=window)
        cos = cosines.setdefault(shipped_backends.cosine_backend, CosineOverCandidates(
            cfg.encoder, queries, shipped_backends.cosine_backend))
        key = window_key(window)
        variant = CosineMixRanker(shipped_backends.cross, mix.weight, mix.scale, cosine=cos)
        variant.calibration = calibration
        out[key] = Remembered(variant, key)
    if cfg.teacher_best_chunk:
        from ragsieve.rerank.chunks import BestChunkRanker

        # as loaded, with its own cosine: chunks are new texts, which the candidates' cosines do not cover
        out[BEST_CHUNK] = Remembered(BestChunkRanker(load_shipped_reranker(teacher)), BEST_CHUNK)
    return out


def choose_backends(cfg: "RerankDistillConfig", teacher: Path, by_dataset: dict[str, dict], console: Console) -> dict:
    """From the teacher's held-out rows on each of ``cfg.teacher_backends`` (``by_dataset``, the evaluation's), write
    the fastest that keeps its quality (:func:`backend_verdict`) into the shipped card, if the shipped weights are
    the teacher's."""
    from ragsieve.rerank.shipped import embedded_reranker_dir

    verdicts = {b: backend_verdict(by_dataset, b, cfg.backend_tolerance) for b in cfg.teacher_backends}
    chosen = next((b for b in cfg.teacher_backends if verdicts[b]["ship"]), None)
    # what a CPU without bf16 matrix units runs instead (bf16 is emulated, slower than fp32, there)
    without_bf16 = next((b for b in cfg.teacher_backends if verdicts[b]["ship"] and "bf16" not in b), None)
    for b, v in verdicts.items():
        console.print(f"teacher@{b}: {'keeps' if v['ship'] else 'misses'} the teacher's quality ({v['why']})")
    out = {"verdicts": verdicts, "chosen": chosen, "without_bf16": without_bf16, "written": False}
    target = Path(cfg.asset_root) / embedded_reranker_dir("base").name if cfg.asset_root \
        else embedded_reranker_dir("base")
    if chosen and (target / "model.safetensors").is_file() \
            and teacher_identity(target) == teacher_identity(teacher):
        write_backends(target, chosen, by_dataset, cfg.backend_tolerance, without_bf16)
        out["written"] = True
        console.print(f"{target}: the shipped teacher now runs on {chosen}")
    return out


def write_backends(folder: Path, backends: str, by_dataset: dict[str, dict], tolerance: float,
                   without_bf16: str | None = None) -> None:
    """Set a mixed reranker card's cross-encoder and cosine backends, with the held-out evidence, and the
    pair a CPU without bf16 matrix units loads instead (``without_bf16``; the card's fp32 default if None)."""
    from ragsieve.rerank.shipped import CARD

    cross_backend, cosine_backend = backends.split("+")
    card = json.loads((folder / CARD).read_text())
    card.pop("without_bf16", None)
    if "bf16" in backends:
        cross, cosine = (without_bf16 or "torch+torch").split("+")
        card["without_bf16"] = {"default_backend": cross, "cosine_backend": cosine}
    key = variant_key(backends)
    card.update({
        "default_backend": cross_backend, "cosine_backend": cosine_backend,
        "backend_choice": {
            "by": "experiments/rerank_distill.yaml (teacher_backends): the fastest shown within "
                  f"{tolerance} nDCG@10 of fp32 on every held-out set (paired interval by query), not "
                  "measurably below cosine",
            "heldout_ndcg10_vs_fp32": {
                name: {k: round(rows[key]["vs_teacher"][k], 4) for k in ("diff", "low", "high")}
                for name, rows in by_dataset.items()},
            "n_queries": {name: rows[key]["n"] for name, rows in by_dataset.items()},
        },
    })
    with atomic_file(folder / CARD) as tmp:
        tmp.write_text(json.dumps(card, indent=2) + "\n")


def variant_tables(by_dataset: dict[str, dict]) -> list[str]:
    """Markdown lines: every ``teacher@...`` row of the evaluation beside the teacher and cosine, per set."""
    variants = [k for k in dict.fromkeys(k for rows in by_dataset.values() for k in rows) if k.startswith("teacher@")]
    if not variants:
        return []
    lines = ["## The teacher itself on faster forwards (`teacher_backends`) and longer windows", "",
             "`teacher@<cross-encoder backend>+<cosine backend>`: the same weights and mix; \"torch\" is fp32 "
             "(the cross-encoder's fp32 logit read from the records), \"torch-bf16\" fp32 under bf16 autocast, "
             "\"onnx-int8\" the int8 per-channel ONNX forward, \"openvino-bf16\" the fp32 ONNX export on "
             "OpenVINO with bf16 products. `teacher@window<N>`: the shipped backends with the cross-encoder "
             "reading N tokens per pair instead of the card's max_length (`teacher_windows`). "
             "`teacher@best-chunk`: the shipped backends at the card's window, a longer candidate scored by "
             "its best window-sized chunk, as `serve` scores documents.", "",
             "| set | n | variant | teacher | variant nDCG@10 | − teacher [95 %] | − cosine [95 %] | ECE |",
             "|---|---|---|---|---|---|---|---|"]
    for key in variants:
        for name, rows in by_dataset.items():
            if key in rows:
                x = rows[key]
                lines.append(" | ".join([f"| {name}", str(x["n"]), f"`{key[len('teacher@'):]}`",
                                         cell_mean(rows["teacher"]["nDCG@10"]), cell_mean(x["nDCG@10"]),
                                         cell_diff(x["vs_teacher"]), cell_diff(x["vs_cosine"]),
                                         cell_interval(x.get("ece"))]) + " |")
    lines.append("")
    return lines
