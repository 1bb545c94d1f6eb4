"""How far one calibration goes: ECE of the rerankers' [0, 1] scores on the held-out gold sets.

One of the three studies ``experiments/rerank_distill.yaml`` runs (beside :mod:`studies.rerank_distill` and
:mod:`studies.rerank_distill_backends`). :func:`heldout_calibration` is the ECE report (any ranker, e.g. the
current default; the distillation's evaluation reads every row's ECE through it); :func:`calibration_limits`
asks, from the teacher's recorded held-out scores, what the shipped calibration, one map fitted to the held-out
sets themselves, one fitted on the other sets and one refitted on a set's own queries reach
(:func:`calibration_transfer`), and :func:`limits_tables` writes that as a table of ``TABLES.md``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np
from rich.console import Console

from ragsieve.benchmarks.mining import SOURCES
from ragsieve.errors import RagsieveError
from ragsieve.rerank.base import BaseRanker
from studies.rerank_distill_common import teacher_scores_identity

if TYPE_CHECKING:
    from studies.rerank_distill import RerankDistillConfig

log = logging.getLogger(__name__)


def heldout_calibration(ranker: BaseRanker, datasets: Sequence[str] = SOURCES, max_queries: int | None = None,
                        n_bins: int = 10, n_boot: int = 1000, seed: int = 0, data_dir=None) -> dict:
    """ECE of the [0, 1] scores the API returns (:meth:`BaseRanker.unit_scores`) on the held-out gold sets.

    Every candidate of every held-out query is one (probability, relevant?) pair; the 95 % interval
    resamples whole queries. Returns ``{dataset: {"queries", "pairs", "relevant", "ece": {"mean",
    "low", "high"}}}`` plus ``"all"`` (every set pooled).

    Example::

        heldout_calibration(load_reranker("embedded:base"), ["fever"], max_queries=20)["fever"]["ece"]
    """
    from ragsieve.benchmarks.forgetting import heldout_queries
    from ragsieve.eval.calibration import expected_calibration_error
    from ragsieve.eval.stats import bootstrap_metric

    def ece(y, p):
        return expected_calibration_error(y, p, n_bins=n_bins)

    out: dict = {}
    pooled: dict[str, list] = {"y": [], "p": [], "g": []}
    for name in datasets:
        ys, ps, groups = [], [], []
        for q in heldout_queries(name, data_dir, seed, max_queries):
            if not q.candidates:
                continue
            ps += list(ranker.unit_scores(ranker.score(q.query, list(q.candidates))))
            ys += [int(p.id in q.relevant) for p in q.candidates]
            groups += [f"{name}/{q.query_id}"] * len(q.candidates)
        est, lo, hi = bootstrap_metric(ece, np.array(ys), np.array(ps), groups=np.array(groups), n_boot=n_boot,
                                       seed=seed)
        out[name] = {"queries": len(set(groups)), "pairs": len(ys), "relevant": int(sum(ys)),
                     "ece": {"mean": est, "low": lo, "high": hi}}
        pooled["y"] += ys
        pooled["p"] += ps
        pooled["g"] += groups
        log.info("ECE %s: %.3f [%.3f, %.3f] over %d pairs", name, est, lo, hi, len(ys))
    if pooled["y"]:
        est, lo, hi = bootstrap_metric(ece, np.array(pooled["y"]), np.array(pooled["p"]),
                                       groups=np.array(pooled["g"]), n_boot=n_boot, seed=seed)
        out["all"] = {"queries": len(set(pooled["g"])), "pairs": len(pooled["y"]), "relevant": int(sum(pooled["y"])),
                      "ece": {"mean": est, "low": lo, "high": hi}}
    return out


def calibration_transfer(sets: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], shipped, n_bins: int = 10,
                         refit_queries: int = 40, draws: int = 20, seed: int = 0) -> dict:
    """How far one calibration can go: per held-out set, ECE of ``shipped`` (a
    :class:`~ragsieve.rerank.calibration.Calibration`), of the one Platt map fitted to the held-out sets
    themselves for the smallest worst-set ECE (a grid over slope and bias: no single map of this score does
    better on all sets at once), of one isotonic map fitted to them (sets weighed equally), of a Platt map fitted
    on the other sets (an unseen corpus), and of a Platt map
    refitted on ``refit_queries`` queries of the set itself, scored on its other queries (median and 2.5-97.5 %
    range over ``draws`` random splits): what a user's own labels buy.

    ``sets`` maps a set's name to (raw scores, 0/1 labels, query ids), one entry per candidate.

    Example::

        calibration_transfer({"a": (np.array([2., -1.]), np.array([1, 0]), np.array(["q", "q"]))}, cal, draws=2)
    """
    from scipy.special import expit
    from sklearn.isotonic import IsotonicRegression

    from ragsieve.eval.calibration import expected_calibration_error as ece
    from ragsieve.rerank.calibration import Calibration

    out: dict = {"shipped": {n: ece(y, shipped.proba(x), n_bins) for n, (x, y, _) in sets.items()}}
    best: tuple[float, float, float] = (np.inf, 1.0, 0.0)
    for slope in np.linspace(0.1, 1.5, 57):  # z = slope * score + bias, the shipped map's family
        for bias in np.linspace(-6.0, 1.0, 71):
            worst = max(ece(y, expit(slope * x + bias), n_bins) for x, y, _ in sets.values())
            best = min(best, (worst, slope, bias))
    out["one_platt_oracle"] = {"slope": best[1], "bias": best[2], "by_set": {
        n: ece(y, expit(best[1] * x + best[2]), n_bins) for n, (x, y, _) in sets.items()}}
    xs, ys = np.concatenate([x for x, _, _ in sets.values()]), np.concatenate([y for _, y, _ in sets.values()])
    weights = np.concatenate([np.full(len(y), 1.0 / len(y)) for _, y, _ in sets.values()])
    iso = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(xs, ys, sample_weight=weights)
    out["one_isotonic_oracle"] = {n: ece(y, iso.predict(x), n_bins) for n, (x, y, _) in sets.items()}
    out["leave_one_set_out"] = {}  # a Platt map fitted on the other sets (pairs repeated so sets weigh alike)
    for n, (x, y, _) in sets.items():
        others = [(xo, yo) for m, (xo, yo, _) in sets.items() if m != n]
        if others:
            reps = [max(1, round(max(len(yo) for _, yo in others) / len(yo))) for _, yo in others]
            cal = Calibration.fit(np.concatenate([np.tile(xo, r) for (xo, _), r in zip(others, reps)]),
                                  np.concatenate([np.tile(yo, r) for (_, yo), r in zip(others, reps)]))
            out["leave_one_set_out"][n] = ece(y, cal.proba(x), n_bins)
    rng = np.random.default_rng(seed)
    # refit: plain Platt (1 / 0 targets), and as `ragsieve rerank calibrate` fits (Platt's targets), on the same splits
    out["refit_on_own_queries"], out["refit_on_own_queries_platt_targets"] = {}, {}
    for n, (x, y, groups) in sets.items():
        queries = np.unique(groups)
        k = min(refit_queries, len(queries) // 2)
        values: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(draws):
            fit = np.isin(groups, rng.choice(queries, size=k, replace=False))
            try:
                for targets in (False, True):
                    cal = Calibration.fit(x[fit], y[fit], platt_targets=targets)
                    values[targets].append(ece(y[~fit], cal.proba(x[~fit]), n_bins))
            except RagsieveError:  # a draw with one class only
                continue
        for targets, key in ((False, "refit_on_own_queries"), (True, "refit_on_own_queries_platt_targets")):
            v = values[targets]
            out[key][n] = {"fit_queries": int(k), "draws": len(v), **(
                {"median": float(np.median(v)), "low": float(np.percentile(v, 2.5)),
                 "high": float(np.percentile(v, 97.5))} if v else {})}
    return out


def calibration_limits(cfg: "RerankDistillConfig", teacher: Path, console: Console) -> dict | None:
    """:func:`calibration_transfer` of the teacher's recorded held-out scores (None when a set's scores are
    not all recorded yet: it scores nothing itself)."""
    from ragsieve.benchmarks.forgetting import heldout_queries
    from ragsieve.data.score_records import PairScores
    from ragsieve.rerank.calibration import Calibration
    from ragsieve.rerank.shipped import read_card

    card = read_card(teacher)
    if not cfg.records or "calibration" not in card:
        return None
    identity = teacher_scores_identity(cfg.encoder, teacher)  # hashes the weights: once, not per set
    sets = {}
    for name in cfg.datasets:
        recorded = PairScores(Path(cfg.records) / "eval-teacher", name, identity)
        x, y, groups = [], [], []
        queries = heldout_queries(name, cfg.data_dir, cfg.seed, cfg.eval_queries)
        recorded_as = {q.query: q.query_id for q in queries}  # by query text, as the evaluation records them
        for q in queries:
            scores = recorded.lookup(recorded_as[q.query], [p.id for p in q.candidates])
            if scores is None:
                console.print(f"calibration limits: {name}'s held-out scores are not all recorded; skipped")
                return None
            x += scores
            y += [int(p.id in q.relevant) for p in q.candidates]
            groups += [q.query_id] * len(q.candidates)
        sets[name] = (np.array(x), np.array(y), np.array(groups))
    shipped = Calibration(**{k: v for k, v in card["calibration"].items() if k in ("temperature", "bias")})
    return calibration_transfer(sets, shipped, cfg.ece_bins, seed=cfg.seed)


def limits_tables(limits: dict) -> list[str]:
    """Markdown lines of :func:`calibration_transfer`'s result: ECE per held-out set, per way of calibrating."""
    platt, refit = limits["one_platt_oracle"], limits["refit_on_own_queries"]
    lines = ["## How far one calibration goes (the teacher's score, ECE per held-out set)", "",
              "Shipped: the card's calibration (fitted on dev). One Platt / one isotonic map: fitted to these "
              "held-out sets themselves (an oracle; Platt for the smallest worst-set ECE, slope "
              f"{platt['slope']:.3f}, bias {platt['bias']:.2f}; isotonic with the sets weighed equally). Refit: a "
              "Platt map fitted on the set's own queries, scored on its others (median [2.5-97.5 %] over random "
              "splits). Fitted on the other sets: a Platt map fitted on the other five, as on an unseen corpus.",
              "",
              "| set | shipped | one Platt map (oracle) | one isotonic map (oracle) | fitted on the other sets "
              "| refit on own queries | refit as `ragsieve rerank calibrate` (Platt's targets) |",
              "|---|---|---|---|---|---|---|"]

    def own(r: dict | None) -> str:
        return f"{r['median']:.3f} [{r['low']:.3f}, {r['high']:.3f}] ({r['fit_queries']} queries)" \
            if r and "median" in r else "–"

    for name, shipped in limits["shipped"].items():
        lodo = limits.get("leave_one_set_out", {}).get(name)
        targets = limits.get("refit_on_own_queries_platt_targets", {}).get(name)
        lines.append(f"| {name} | {shipped:.3f} | {platt['by_set'][name]:.3f} | "
                     f"{limits['one_isotonic_oracle'][name]:.3f} | {'–' if lodo is None else f'{lodo:.3f}'} "
                     f"| {own(refit[name])} | {own(targets)} |")
    lines.append("")
    return lines
