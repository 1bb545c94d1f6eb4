"""``ragsieve run experiments/rerank_align_guard.yaml``: align the reranker without forgetting (issue #18).

Aligned on confidence-shift preferences alone, the base reranker loses general relevance
(MRR@10 on gold sets drops a lot). This study trains one aligned reranker per guard
(:mod:`ragsieve.rerank.training.trainer`) from the same start (``embedded:base``) on the committed
preference set (``results/rerank_align_guard/prefs``) and measures, per variant:

(a) the preference test set ranking (P@k, R@k, MRR as in ``rerank_align``'s Table 1) with a
    paired test against the start reranker: exact McNemar on P@1, paired bootstrap on P@3;
(b) forgetting: MRR@10 / nDCG@10 on the six held-out gold relevance sets, paired against the
    start reranker (:func:`ragsieve.benchmarks.forgetting.measure_forgetting`).

"base" everywhere is the start reranker as a user gets it: ``embedded:base`` scores its
cross-encoder logit plus ``w · 20 ·`` MiniLM cosine (its card), torch fp32 at ``eval_max_length``
like the variants. A variant folder without that card (``unguarded``, today's recipe) scores
with the logit alone, so its row shows what a sieve loses by swapping the shipped reranker for
it; the training-side guards all keep the card (``cosine_mix``), since it costs nothing. The start's cross-encoder alone is scored once too, as the ``base-ce`` row
(``compare_plain``): it separates what training forgot from what dropping the cosine term costs.

Resumable variant by variant: models under ``<out>/work/<variant>/`` (git-ignored, reused when
their training config is unchanged), per-query scores under ``<out>/work/forgetting`` and
``<out>/work/prefs_test``, and each finished variant's results in ``<out>/variants/<variant>.json``
(committed; a finished variant with an unchanged config is skipped). Then:
``metrics.json`` (with the best guard chosen by :func:`choose_best`) and ``forgetting.md``, rewritten
after every variant over the variants finished so far.

Example::

    ragsieve run experiments/rerank_align_guard.yaml
    # or, in Python
    from studies.runner import run_experiment_file
    run_experiment_file("experiments/rerank_align_guard.yaml")["best_guard"]["best"]
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np
from pydantic import Field, ValidationInfo, field_validator
from rich.console import Console

from ragsieve.config import StrictConfig, format_validation_error
from ragsieve.benchmarks.mining import SOURCES
from ragsieve.rerank.training.trainer import CrossEncoderTrainConfig

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")  # a variant name is a folder and a file name


def _unguarded() -> CrossEncoderTrainConfig:
    # today's aligned recipe (rerank_align: lr 6e-5, 1 epoch, 1 positive + 5 negatives), except
    # max_length 256 instead of 512 to halve the cost; `init` is ignored (the study's `init` is used)
    return CrossEncoderTrainConfig(init="", group_size=6, lr=6e-5, epochs=1.0, max_length=256)


def _default_variants() -> dict[str, dict[str, Any]]:
    return {
        "unguarded": {},
        "mix": {"cosine_mix": True},
        # training-side guards stack on the cosine mix (free, and the default once measured)
        "mix+distill": {"cosine_mix": True, "distill_weight": 1.0},
        "mix+replay-0.5": {"cosine_mix": True, "replay_ratio": 0.5},
        "mix+lowlr": {"cosine_mix": True, "lr": 1e-5, "eval_steps": 20},
        "mix+lora-8": {"cosine_mix": True, "lora_r": 8},
        "mix+replay+distill": {"cosine_mix": True, "replay_ratio": 0.5, "distill_weight": 1.0},
    }


class GoldGroupsConfig(StrictConfig):
    """Gold relevance groups for replay and relevance-dev early stopping (never held-out questions)."""

    # mined rows (train / dev splits of the base reranker's mining) when <dataset>.jsonl is here;
    # otherwise the relevance train split with its own candidates (ragsieve.benchmarks.relevance)
    mined_dir: str = "results/rerank_base/work/mined"
    replay_per_dataset: int = Field(100, ge=1)
    dev_per_dataset: int = Field(10, ge=1)
    negatives: int = Field(7, ge=1)  # per group, for the relevance-split fallback


class RerankAlignGuardConfig(StrictConfig):
    prefs_dir: str = "results/rerank_align_guard/prefs"  # prefs_train.jsonl, prefs_test.jsonl, shifts.jsonl
    init: str = "embedded:base"  # every variant starts here: a cross-encoder folder or embedded:base
    train: CrossEncoderTrainConfig = Field(default_factory=_unguarded)
    # variant name → CrossEncoderTrainConfig fields that differ from `train`
    variants: dict[str, dict[str, Any]] = Field(default_factory=_default_variants)
    gold: GoldGroupsConfig = Field(default_factory=GoldGroupsConfig)
    table_ks: list[int] = [1, 3, 5]  # preference test cut-offs (P@1 and P@3 are tested against base)
    eval_max_length: int = Field(256, ge=32)
    forgetting_max_queries: int = Field(100, ge=1)  # held-out queries per dataset (cost: ≈ 20 pairs each)
    compare_plain: bool = True  # also score the start's cross-encoder alone (no cosine mix), once
    datasets: list[str] = list(SOURCES)
    # a variant keeps relevance if its MRR@10 ≥ base − this (or is not measurably below base) on every dataset
    max_mrr_drop: float = Field(0.01, ge=0)
    bootstrap: int = Field(2000, ge=100)
    data_dir: Optional[str] = None
    seed: int = 0

    @field_validator("datasets")
    @classmethod
    def _known_datasets(cls, value: list[str]) -> list[str]:
        unknown = [d for d in value if d not in SOURCES]
        if unknown or not value:
            raise ValueError(f"datasets must be some of {list(SOURCES)}, got {value}")
        return value

    @field_validator("table_ks")
    @classmethod
    def _needs_1_and_3(cls, value: list[int]) -> list[int]:
        if not {1, 3} <= set(value) or any(k < 1 for k in value):
            raise ValueError("table_ks must be positive and include 1 and 3 (P@1 and P@3 are tested)")
        return sorted(set(value))

    @field_validator("variants")
    @classmethod
    def _variants_are_valid(cls, value: dict[str, dict[str, Any]], info: ValidationInfo) -> dict[str, dict[str, Any]]:
        if not value:
            raise ValueError("give at least one")
        train = info.data.get("train")
        for name, fields in value.items():
            if not _NAME.match(name) or name == "base":
                raise ValueError(f"variant name '{name}': letters, digits and _ . + - only, and not 'base'")
            if train is not None:
                _variant_config(train, name, fields, "")  # raises on an unknown field or a bad value
        return value

    def variant_config(self, name: str, init: str) -> CrossEncoderTrainConfig:
        """``train`` with the variant's fields, starting from ``init``."""
        return _variant_config(self.train, name, self.variants[name], init)


def _variant_config(train: CrossEncoderTrainConfig, name: str, fields: dict[str, Any],
                    init: str) -> CrossEncoderTrainConfig:
    from pydantic import ValidationError

    try:
        return CrossEncoderTrainConfig.model_validate({**train.model_dump(), **fields, "init": init})
    except ValidationError as exc:
        raise ValueError(format_validation_error(exc, f"variant '{name}'")) from None


class RerankAlignGuardStudy:
    Config = RerankAlignGuardConfig

    def run(self, cfg: RerankAlignGuardConfig, out_dir: Path, console: Console) -> dict:
        from ragsieve.prefs.preferences import read_preferences
        from ragsieve.benchmarks.forgetting import measure_forgetting
        from ragsieve.rerank.shipped import scoring_key, weights_key
        from ragsieve.registry import reranker_folder
        from studies.common import write_json
        from studies.rerank_align import compare_preferences, preference_ranking_queries

        out_dir = Path(out_dir)
        work = out_dir / "work"
        prefs = Path(cfg.prefs_dir)
        base_dir = Path(reranker_folder(cfg.init, "init"))
        train_records = read_preferences(prefs / "prefs_train.jsonl")
        test_records = read_preferences(prefs / "prefs_test.jsonl")
        test_queries = preference_ranking_queries(test_records, prefs / "shifts.jsonl")
        base_key = weights_key(base_dir)
        base_pref = self._prefs_per_query(cfg, base_dir, base_key, test_queries, work)
        exclude = {r.query_id for r in test_records if r.query_id}
        gold: dict = {}  # built once, when the first variant needing it trains
        results: dict[str, dict] = {}
        for name in cfg.variants:
            train_cfg = cfg.variant_config(name, str(base_dir))
            # the base's weights key too: a re-shipped embedded:base makes every variant stale
            settings = {"train": train_cfg.model_dump(exclude={"init"}), "init": cfg.init, "base_weights": base_key,
                        "forgetting_max_queries": cfg.forgetting_max_queries, "datasets": cfg.datasets,
                        "eval_max_length": cfg.eval_max_length, "compare_plain": cfg.compare_plain}
            path = out_dir / "variants" / f"{name}.json"
            if path.is_file():
                done = json.loads(path.read_text())
                if done.get("settings") == settings:
                    console.print(f"{name}: done before ({path})")
                    results[name] = done
                    continue
                console.print(f"{name}: settings changed since {path}; running it again")
            t0 = time.perf_counter()
            needs = train_cfg.replay_ratio > 0 or train_cfg.eval_steps > 0
            if needs and not gold:
                gold = self._gold_groups(cfg, work, exclude, console)
            model_dir, training = self._train(name, train_cfg, train_records, gold, base_key, work, console)
            key = weights_key(model_dir)
            pref = self._prefs_per_query(cfg, model_dir, key, test_queries, work)
            console.print(f"{name}: forgetting on {len(cfg.datasets)} held-out relevance sets")
            rankers = {"base": lambda: _cross_encoder(base_dir, cfg.eval_max_length),
                       name: lambda d=model_dir: _cross_encoder(d, cfg.eval_max_length)}
            keys = {"base": scoring_key(base_dir, base_key), name: scoring_key(model_dir, key)}
            if cfg.compare_plain:
                rankers["base-ce"] = lambda: _cross_encoder(base_dir, cfg.eval_max_length, plain=True)
                keys["base-ce"] = f"plain-{base_key}"
            forgetting = measure_forgetting(
                rankers, "base", datasets=cfg.datasets, max_queries=cfg.forgetting_max_queries,
                cache_dir=work / "forgetting", keys=keys, n_boot=cfg.bootstrap, seed=cfg.seed, data_dir=cfg.data_dir)
            results[name] = {
                "variant": name,
                "settings": settings,
                "weights_key": key,
                "training": training,
                "prefs_test": compare_preferences(pref, base_pref, cfg.bootstrap, cfg.seed),
                "forgetting": forgetting,
                "seconds": time.perf_counter() - t0,
            }
            write_json(path, results[name])  # committable at once: a kill loses at most this variant
            self._summarize(cfg, out_dir, base_dir, base_key, base_pref, results, gold)
            drops = {d: round(v["rankers"][name]["vs_reference"]["MRR@10"]["diff"], 3)
                     for d, v in forgetting["datasets"].items()}
            console.print(f"{name}: P@1 {results[name]['prefs_test']['means']['P@1']:.3f} "
                          f"(base {results[name]['prefs_test']['base_means']['P@1']:.3f}); MRR@10 − base {drops}")
        metrics = self._summarize(cfg, out_dir, base_dir, base_key, base_pref, results, gold)
        console.print(f"best guard: {metrics['best_guard']['best']}")
        return metrics

    @staticmethod
    def _summarize(cfg: RerankAlignGuardConfig, out_dir: Path, base_dir: Path, base_key: str, base_pref: dict,
                   results: dict, gold: dict) -> dict:
        """``metrics.json`` and ``forgetting.md`` over the variants finished so far (rewritten after each one)."""
        from studies.common import write_json
        from studies.rerank_align import preference_means

        metrics = {
            "base": {"folder": str(base_dir), "spec": cfg.init, "weights_key": base_key,
                     "prefs_test": preference_means(base_pref)},
            "variants": results,
            "finished": f"{len(results)} of {len(cfg.variants)} variants",
            "best_guard": choose_best(results, cfg.max_mrr_drop),
            "gold_groups": gold.get("info") or _read_json(out_dir / "work" / "gold_info.json"),
            "config": cfg.model_dump(),
        }
        write_json(out_dir / "metrics.json", metrics)
        (out_dir / "forgetting.md").write_text(markdown_table(metrics) + "\n\n" + preference_table(metrics) + "\n")
        return metrics

    @staticmethod
    def _train(name: str, train_cfg: CrossEncoderTrainConfig, records, gold: dict, base_key: str, work: Path,
               console: Console) -> tuple[Path, dict]:
        """Train the variant into ``work/<name>`` (reused when its card matches) → (folder, training card)."""
        import shutil

        from ragsieve.atomic import atomic_directory
        from ragsieve.rerank.training.trainer import TRAINING_CARD, train_cross_encoder

        model_dir = work / name
        replay = gold.get("replay") if train_cfg.replay_ratio > 0 else None
        dev = gold.get("dev") if train_cfg.eval_steps > 0 else None
        key = {"train": train_cfg.model_dump(), "base_weights": base_key, "records": len(records),
               "replay": len(replay or []), "dev": len(dev or [])}
        card_path = model_dir / "ragsieve_variant.json"
        if card_path.is_file() and json.loads(card_path.read_text()).get("key") == key:
            console.print(f"{name}: model trained before ({model_dir})")
        else:
            console.print(f"{name}: training on {len(records)} preference records"
                          + (f" + replay {len(replay)} gold groups" if replay else "")
                          + (f", early stopping on {len(dev)} dev groups" if dev else ""))
            t = time.perf_counter()
            # a killed training leaves nothing half-written: the folder appears when complete
            with atomic_directory(model_dir, overwrite=True) as tmp:
                train_cross_encoder(records, train_cfg, tmp, replay=replay, relevance_dev=dev)
                shutil.rmtree(tmp / "checkpoints", ignore_errors=True)
                (tmp / "ragsieve_variant.json").write_text(
                    json.dumps({"key": key, "train_seconds": time.perf_counter() - t}, indent=1) + "\n")
        training = json.loads((model_dir / TRAINING_CARD).read_text())
        training["train_seconds"] = json.loads(card_path.read_text())["train_seconds"]
        return model_dir, training

    @staticmethod
    def _prefs_per_query(cfg: RerankAlignGuardConfig, folder: Path, key: str, queries, work: Path) -> dict:
        """Per-question P@k / R@k / MRR@k on the preference test set (cached per weights key)."""
        from ragsieve.rerank.shipped import scoring_key
        from ragsieve.benchmarks.relevance import per_query
        from studies.common import write_json

        ks = tuple(cfg.table_ks)
        cache = work / "prefs_test" / f"{scoring_key(folder, key)}.k{'-'.join(map(str, ks))}.json"
        if cache.is_file():
            return json.loads(cache.read_text())
        per = per_query(_cross_encoder(folder, cfg.eval_max_length), queries, ks=ks, measures=("P", "R", "MRR"))
        write_json(cache, per)
        return per

    @staticmethod
    def _gold_groups(cfg: RerankAlignGuardConfig, work: Path, exclude: set[str], console: Console) -> dict:
        """``{"replay": [...], "dev": [...], "info": {...}}``, built once into ``work/gold_*.jsonl``."""
        from ragsieve.prefs.preferences import read_preferences, write_preferences
        from studies.common import write_json

        files = {part: work / f"gold_{part}.jsonl" for part in ("replay", "dev")}
        info_path = work / "gold_info.json"
        if all(f.is_file() for f in files.values()) and info_path.is_file():
            out = {part: read_preferences(f) for part, f in files.items()}
            return {**out, "info": json.loads(info_path.read_text())}
        replay, dev, info = [], [], {}
        for name in cfg.datasets:
            r, d, source = gold_groups_for(name, cfg.gold, cfg.data_dir, cfg.seed, exclude)
            replay += r
            dev += d
            info[name] = {"source": source, "replay": len(r), "dev": len(d)}
            console.print(f"gold groups {name}: {len(r)} replay + {len(d)} dev ({source})")
        for part, rows in (("replay", replay), ("dev", dev)):
            write_preferences(files[part], rows)
        write_json(info_path, info)
        return {"replay": replay, "dev": dev, "info": info}


def gold_groups_for(name: str, gold: GoldGroupsConfig, data_dir=None, seed: int = 0,
                    exclude: set[str] = frozenset()) -> tuple[list, list, str]:
    """(replay groups, dev groups, where they came from) for one dataset; no held-out question, none in ``exclude``.

    From the base reranker's mined rows when ``<mined_dir>/<name>.jsonl`` exists (its train and dev
    splits, held-out questions and their gold passages already excluded); else from the relevance
    train split (:func:`~ragsieve.benchmarks.relevance.split_questions`) with the dataset's own candidates,
    dropping questions whose gold passage is gold for a held-out question.
    """
    from ragsieve.prefs.preferences import PreferenceRecord

    mined = Path(gold.mined_dir) / f"{name}.jsonl"
    if mined.is_file():
        from ragsieve.benchmarks.mining import read_mined

        def record(m: dict) -> PreferenceRecord:
            return PreferenceRecord(m["query"], [p[1] for p in m["pos"]], [n[1] for n in m["neg"]],
                                    [1.0] * len(m["pos"]), [0.0] * len(m["neg"]), m.get("qid", ""),
                                    [p[0] for p in m["pos"]], [n[0] for n in m["neg"]])

        rows = [m for m in read_mined(mined) if m["pos"] and m["neg"] and m.get("qid") not in exclude]
        replay = [record(m) for m in rows if m["split"] == "train"][: gold.replay_per_dataset]
        dev = [record(m) for m in rows if m["split"] == "dev"][: gold.dev_per_dataset]
        return replay, dev, f"mined ({mined})"

    from ragsieve.data import held_out_questions, load_dataset
    from ragsieve.benchmarks.mining import held_out_sources
    from ragsieve.benchmarks.relevance import split_questions, training_groups

    source = held_out_sources()[name]
    ds = load_dataset(name, data_dir=data_dir)
    train, _ = split_questions(ds, source.model_copy(update={"train_questions": 10**9}), seed)
    by_id = ds.passage_by_id()
    held = held_out_questions([q for q in ds.questions if q.gold_passage_ids], source.test_fraction, seed)
    held_texts = {by_id[p].full_text for q in held for p in q.gold_passage_ids if p in by_id}
    # a train question whose gold passage is a held-out question's gold would leak it (MultiRC shares passages)
    train = [q for q in train if q.id not in exclude
             and not any(by_id[p].full_text in held_texts for p in q.gold_passage_ids if p in by_id)]
    n = gold.dev_per_dataset + gold.replay_per_dataset
    groups = training_groups(ds, train[: 2 * n], source, negatives=gold.negatives, seed=seed)[:n]
    return groups[gold.dev_per_dataset:], groups[: gold.dev_per_dataset], "relevance train split"


BEST_RULE = ("among variants whose held-out MRR@10 stays >= base - max_mrr_drop on every dataset, or is not "
             "measurably below base there (paired bootstrap), the highest preference-test P@1 (ties: P@3)")


def choose_best(results: dict[str, dict], max_mrr_drop: float = 0.01) -> dict:
    """The best guard: :data:`BEST_RULE`, applied to finished variants; ``best`` is None when none qualifies.

    Example::

        choose_best(metrics["variants"], 0.01)["best"]     # e.g. "distill-1"
    """
    keeps: dict[str, dict[str, bool]] = {}
    for name, r in results.items():
        keeps[name] = {}
        for ds, d in r["forgetting"]["datasets"].items():
            diff = d["rankers"][name]["vs_reference"]["MRR@10"]
            keeps[name][ds] = diff["diff"] >= -max_mrr_drop or diff["verdict"] != "B better"
    eligible = [n for n in results if keeps[n] and all(keeps[n].values())]

    def score(n: str) -> tuple[float, float]:
        m = results[n]["prefs_test"]["means"]
        return m["P@1"], m["P@3"]

    best = max(eligible, key=score) if eligible else None  # max keeps the first of equal scores
    return {"rule": BEST_RULE, "max_mrr_drop": max_mrr_drop, "keeps_relevance": keeps, "eligible": eligible,
            "best": best, "p_at_1": {n: score(n)[0] for n in results}}


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _cross_encoder(folder: Path, max_length: int, plain: bool = False):
    """The folder as ``load_reranker`` scores it (a card's cosine mix included), torch fp32; or its logit alone."""
    from ragsieve.rerank.neural import CrossEncoderRanker
    from ragsieve.rerank.shipped import load_cross_encoder

    if plain:
        return CrossEncoderRanker(str(folder), max_length=max_length)
    return load_cross_encoder(str(folder), max_length=max_length, backend="torch")


def markdown_table(metrics: dict) -> str:
    """Forgetting table: base and every variant per dataset, mean [95 % CI], the paired difference to base."""
    lines = ["| dataset (n) | reranker | MRR@10 [95 % CI] | − base MRR@10 [95 % CI] | nDCG@10 [95 % CI] "
             "| − base nDCG@10 [95 % CI] | keeps relevance? |",
             "|---|---|---|---|---|---|---|"]
    variants = metrics["variants"]
    keeps = metrics["best_guard"]["keeps_relevance"]
    if not variants:
        return "\n".join(lines)
    first = next(iter(variants.values()))["forgetting"]["datasets"]

    def cell(v: dict) -> str:
        return f"{v['mean']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"

    def diff(v: dict) -> str:
        return f"{v['diff']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}]"

    for ds, d in first.items():
        base = d["rankers"]["base"]
        lines.append(f"| {ds} ({d['n']}) | base | {cell(base['MRR@10'])} | | {cell(base['nDCG@10'])} | | |")
        shipped = d["rankers"].get("base-ce")
        if shipped:  # the start's cross-encoder without its cosine mix: not a candidate, a yardstick
            vs = shipped["vs_reference"]
            lines.append(f"| | base-ce | {cell(shipped['MRR@10'])} | {diff(vs['MRR@10'])} | {cell(shipped['nDCG@10'])} "
                         f"| {diff(vs['nDCG@10'])} | |")
        for name, r in variants.items():
            row = r["forgetting"]["datasets"].get(ds, {}).get("rankers", {}).get(name)
            if row is None:
                continue
            vs = row["vs_reference"]
            verdict = "yes" if keeps[name].get(ds) else "no: measurably below"
            lines.append(f"| | {name} | {cell(row['MRR@10'])} | {diff(vs['MRR@10'])} | {cell(row['nDCG@10'])} "
                         f"| {diff(vs['nDCG@10'])} | {verdict} |")
    return "\n".join(lines)


def preference_table(metrics: dict) -> str:
    """Preference test table: P@1 / P@3 / R@5 / MRR per variant, P@1 (McNemar) and P@3 (bootstrap) vs base."""
    base = metrics["base"]["prefs_test"]
    mrr = next((k for k in base if k.startswith("MRR@")), "MRR@5")
    recall = next((k for k in sorted(base, reverse=True) if k.startswith("R@")), "R@5")
    lines = [f"| reranker | P@1 | − base P@1 (McNemar p) | P@3 | − base P@3 [95 % CI] | {recall} | {mrr} |",
             "|---|---|---|---|---|---|---|",
             f"| base | {base['P@1']:.3f} | | {base['P@3']:.3f} | | {base[recall]:.3f} | {base[mrr]:.3f} |"]
    for name, r in metrics["variants"].items():
        m, vs = r["prefs_test"]["means"], r["prefs_test"]["vs_base"]
        p1, p3 = vs["P@1"], vs["P@3"]
        lines.append(f"| {name} | {m['P@1']:.3f} | {p1['diff']:+.3f} (p = {p1['p_value']:.3f}) | {m['P@3']:.3f} "
                     f"| {p3['diff']:+.3f} [{p3['low']:+.3f}, {p3['high']:+.3f}] | {m[recall]:.3f} | {m[mrr]:.3f} |")
    best = metrics["best_guard"]
    lines.append("")
    lines.append(f"Best guard ({best['rule']}, max_mrr_drop {best['max_mrr_drop']}): **{best['best']}**")
    return "\n".join(lines)
