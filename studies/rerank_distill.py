"""``ragsieve run experiments/rerank_distill.yaml``: one forward instead of two (issue 40).

The yaml runs three studies over one held-out evaluation: this one (the students), the teacher itself on faster
forwards and longer windows (:mod:`studies.rerank_distill_backends`, before the students when
``teacher_backends`` is set) and how far one calibration goes (:mod:`studies.rerank_distill_calibration`); what
they share is in :mod:`studies.rerank_distill_common`.

The shipped ``embedded:base`` scores ``logit + 0.25 · 20 · cosine``: a cross-encoder *and* MiniLM.
This study distils that mixed score (the teacher) into single cross-encoders (the students) and
ships a student only when it keeps the teacher's quality. Phases, each resumable after a kill
(work files under ``<out_dir>/work/``, git-ignored):

1. **mine** — the base recipe's candidate pools of the six datasets and the HotpotQA 1,517 pool
   (:func:`ragsieve.benchmarks.mining.mine_all`; ``mined_dir`` reuses another run's files).
2. **teacher** — the teacher's score of every mined (query, passage), cached per dataset
   (:func:`ragsieve.rerank.training.distill.cache_teacher_scores`): the cosine is already in the mined
   rows, so only the cross-encoder runs.
3. **train** — per student: the teacher's first ``layers`` layers (head included) as the start
   (:func:`~ragsieve.rerank.training.distill.truncated_student`), listwise KL to the teacher's scores
   plus InfoNCE on gold (:func:`~ragsieve.rerank.training.distill.train_distilled`, ``teacher_scale 1``:
   the teacher's scores are already logits), early stopping on dev nDCG@10.
4. **evaluate** — held-out nDCG@10 on the six gold sets for the teacher, MiniLM cosine and each
   student, per query; each student's paired bootstrap difference (queries resampled) to the teacher
   and to cosine, its verdict on the tolerance (``target_verdict``), and the ECE of its calibrated
   probability (calibration fitted on the dev questions' candidate lists, :func:`calibration_pairs`)
   → ``metrics.json``. Each student is also scored on its int8 per-channel ONNX forward, and judged as
   it would ship: on int8 if that variant meets the targets itself (the faster default), else on fp32.
5. **ship** — a student whose difference to the teacher is above ``-tolerance`` on every set at the
   point estimate and not measurably below cosine anywhere is written to ``ragsieve/assets/<asset>``
   (fp16 safetensors, int8 ONNX, card with its calibration); ``embedded:<name>`` then resolves to it.

Phases 3-5 run student by student: per asset name, fewest layers first, and once a student takes the
name the larger candidates for it are not trained.

With ``records`` (a committed folder, :mod:`ragsieve.data.score_records`), the deterministic phases also resume
on another machine: mined rows as ids (text joined back from the data), the teacher's logits and the teacher's
and cosine's held-out scores by (query id, passage id), each folder tied to its teacher or recipe by ``meta.json``.

:func:`~studies.rerank_distill_calibration.heldout_calibration` is the ECE report on its own (any ranker, e.g. the
current default).

Example::

    ragsieve run experiments/rerank_distill.yaml
"""


from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Literal, Sequence

import numpy as np
from pydantic import Field, field_validator
from rich.console import Console

from ragsieve.atomic import atomic_file
from ragsieve.benchmarks.mining import SOURCES, MiningConfig
from ragsieve.config import StrictConfig
from ragsieve.errors import RagsieveError
from ragsieve.models.specs import DEFAULT_ENCODER
from ragsieve.rerank.base import BaseRanker
from ragsieve.rerank.training.distill import DistillConfig
from studies.rerank_distill_backends import (BEST_CHUNK, choose_backends, teacher_variants, variant_key,
                                             variant_tables, window_key)
from studies.rerank_distill_calibration import calibration_limits, heldout_calibration, limits_tables
from studies.rerank_distill_common import (CROSS_ALONE, Remembered, cell_diff, cell_interval, cell_mean, shortfall,
                                           teacher_identity, teacher_scores_identity)

log = logging.getLogger(__name__)


class StudentConfig(StrictConfig):
    """One student: the teacher's first ``layers`` layers, shipped as ``embedded:<name>`` if it keeps quality."""

    name: str  # "fast" → embedded:fast (ragsieve/assets/fast-reranker); "base" replaces embedded:base
    layers: int
    tolerance: float  # the largest held-out nDCG@10 loss to the teacher allowed on each set
    ship: bool = True
    # overrides ``distill.time_budget_minutes`` (a deeper student needs longer for the same pass)
    time_budget_minutes: float | None = None
    # overrides ``distill.alpha`` (the KL-to-teacher weight beside InfoNCE on gold); a candidate with its own
    # alpha gets its own key, so it trains and is evaluated apart from the same depth at the shared alpha
    alpha: float | None = None
    # overrides ``distill.distill_loss`` ("kl" or "margin-mse"); "margin-mse" adds "-mmse" to the key
    distill_loss: Literal["kl", "margin-mse"] | None = None
    # re-initialise the pooler and classifier (truncated_student): "-fh" in the key
    fresh_head: bool = False
    # overrides ``distill.lr`` (a fresh head learns from scratch): "-lr<lr>" in the key
    lr: float | None = None
    # train on the candidate lists of this many train questions per dataset (the kind of list the held-out
    # verdict reranks: BM25's top-20 or the set's own), scored by the teacher, instead of the mined groups:
    # "-cl<n>" in the key (:meth:`RerankDistillStudy.teacher_lists`)
    lists: int = 0
    # overrides ``distill.bf16`` (bf16 autocast training): "-bf16" in the key
    bf16: bool | None = None
    # a candidate not to train: tried already (its verdict in the results README; its weights are gone with
    # the machine it was trained on) or held back until its recipe changes; reported with this reason
    skip: str = ""

    @property
    def key(self) -> str:
        """Several candidates may share a name: of those within target, the one with fewest layers ships."""
        return (f"{self.name}-{self.layers}l" + ("" if self.alpha is None else f"-a{self.alpha:g}")
                + ("-mmse" if self.distill_loss == "margin-mse" else "") + ("-fh" if self.fresh_head else "")
                + ("" if self.lr is None else f"-lr{self.lr:g}") + (f"-cl{self.lists}" if self.lists else "")
                + ("-bf16" if self.bf16 else ""))

    def distill_overrides(self) -> dict:
        """This student's departures from the shared ``distill`` settings."""
        return {k: v for k, v in (("time_budget_minutes", self.time_budget_minutes), ("alpha", self.alpha),
                                  ("distill_loss", self.distill_loss), ("lr", self.lr), ("bf16", self.bf16))
                if v is not None}


def _students() -> list[StudentConfig]:
    # ≤ 3 layers on int8 ONNX is what reaches 3× CrossEncoder.predict (see experiments/rerank_distill.yaml), but
    # three layers, and six with InfoNCE, the listwise KL or Margin-MSE leading, lost quality (results/
    # rerank_distill/README.md): what is left for `base` is other training lists, not another loss
    tried = "tried: missed (results/rerank_distill/README.md)"
    return [StudentConfig(name="base", layers=3, tolerance=0.005, skip=tried),
            StudentConfig(name="base", layers=6, tolerance=0.005, skip=tried),
            StudentConfig(name="base", layers=6, tolerance=0.005, alpha=8.0, skip=tried),
            StudentConfig(name="base", layers=6, tolerance=0.005, time_budget_minutes=150, alpha=8.0,
                          distill_loss="margin-mse", skip=tried),
            StudentConfig(name="fast", layers=1, tolerance=0.02, skip=tried),
            StudentConfig(name="fast", layers=1, tolerance=0.02, fresh_head=True, lr=2e-4, skip=tried),
            StudentConfig(name="fast", layers=2, tolerance=0.02, skip="held back: needs other training lists")]


def _distill() -> DistillConfig:
    # teacher_scale 1: the teacher's mixed scores are logits already
    return DistillConfig(teacher_scale=1.0, time_budget_minutes=70, eval_steps=100)


class RerankDistillConfig(StrictConfig):
    mining: MiningConfig = Field(default_factory=MiningConfig)
    mined_dir: str = ""  # reuse another run's mined rows (e.g. results/rerank_base/work/mined); "" = mine here
    teacher: str = ""  # a cross-encoder folder with a card (its cosine mix is the teacher); "" = embedded:base
    students: list[StudentConfig] = Field(default_factory=_students)
    distill: DistillConfig = Field(default_factory=_distill)
    train_per_dataset: int = 1000
    datasets: list[str] = list(SOURCES)
    eval_queries: int | None = None  # held-out queries per set (None = all)
    bootstrap: int = 2000
    ece_bins: int = 10
    # what each student's calibration is fitted on: "dev-candidates" = the dev questions' retrieved candidate
    # lists, the same kind of list as the held-out sets (the shipped base was fitted on "dev-groups", 1-2 gold
    # + mined hard negatives, and misses ECE 0.05 on four of six held-out sets)
    calibration: Literal["dev-candidates", "dev-groups"] = "dev-candidates"
    # what each student's best checkpoint is chosen on (nDCG@10), the same two kinds of dev list; the students
    # up to session 53 were chosen on "dev-groups"
    select_on: Literal["dev-candidates", "dev-groups"] = "dev-candidates"
    encoder: str = DEFAULT_ENCODER
    # the teacher itself on faster forwards, "<cross-encoder backend>+<cosine backend>" (each a backend of
    # ragsieve.rerank.fast / ragsieve.models.encoder), evaluated as reference rows ``teacher@<variant>``: the fastest
    # shown within ``backend_tolerance`` of the teacher on every set and not measurably below cosine
    # (:func:`backend_verdict`) becomes the shipped teacher's backends (its card), until a student takes
    # ``embedded:base``. Fastest first.
    teacher_backends: list[Literal["openvino-bf16+openvino-bf16", "torch-bf16+openvino-bf16", "torch-bf16+torch-bf16",
                                   "onnx-int8+onnx-int8", "torch+onnx-int8", "torch-bf16+onnx-int8",
                                   "onnx-int8+torch"]] = []
    backend_tolerance: float = 0.005
    # the teacher reading more of each pair: rows ``teacher@window<N>``, its shipped backends (card) with the
    # cross-encoder's window at N tokens instead of the card's max_length (the cosine's MiniLM reads 256 passage
    # tokens either way); reported beside the teacher, never shipped by the study
    teacher_windows: list[int] = []
    # the row ``teacher@best-chunk``: the shipped backends at the card's window, a longer candidate scored by its best
    # window-sized chunk, as `serve` scores documents (ragsieve.rerank.chunks)
    teacher_best_chunk: bool = False
    # text-free records to commit (mined ids, teacher logits, the teacher's and cosine's held-out scores, by
    # query and passage id): read at start, extended as phases run, so a run resumes on another machine
    # without mining or scoring again ("" = none; experiments/rerank_distill.yaml sets results/.../records)
    records: str = ""
    asset_root: str = ""  # where shipped students go ("" = the package's ragsieve/assets)
    data_dir: str | None = None
    seed: int = 0

    @field_validator("students")
    @classmethod
    def _one_key_per_student(cls, students: list[StudentConfig]) -> list[StudentConfig]:
        keys = [st.key for st in students]
        if len(keys) != len(set(keys)):
            dup = sorted({k for k in keys if keys.count(k) > 1})
            raise ValueError(f"two students share the key {', '.join(dup)}: give one its own alpha or distill_loss")
        return students


def _dev_candidates(cfg: RerankDistillConfig, dev: Sequence[dict]) -> tuple[list, list[dict]]:
    """The mined dev questions of each dataset with a held-out set, as ranking queries with the candidate
    lists the held-out evaluation uses (never trained on, never held out), and the dev rows left over (the
    HotpotQA 1,517 pool, questions without a list)."""
    from ragsieve.benchmarks.mining import held_out_sources
    from ragsieve.benchmarks.relevance import ranking_queries
    from ragsieve.data import load_dataset

    sources = held_out_sources()
    queries, leftover = [], []
    by_dataset: dict[str, list[dict]] = {}
    for row in dev:
        by_dataset.setdefault(row.get("dataset", ""), []).append(row)
    for name, rows in by_dataset.items():
        if name not in sources:
            leftover += rows
            continue
        ds = load_dataset(name, data_dir=cfg.data_dir)
        ids = {r["qid"] for r in rows}
        found = ranking_queries(ds, [q for q in ds.questions if q.id in ids], sources[name])
        queries += found
        listed = {q.query_id for q in found}
        leftover += [r for r in rows if r["qid"] not in listed]
    return queries, leftover


def calibration_pairs(cfg: RerankDistillConfig, dev: Sequence[dict]) -> tuple[list[str], list[str], list[int]]:
    """(queries, passages, labels) a student's calibration is fitted on (see ``RerankDistillConfig.calibration``).

    ``dev-candidates``: for each dataset with a held-out set, its mined dev questions (never trained on, never
    held out) with the candidate lists the held-out evaluation uses; other rows (the HotpotQA 1,517 pool)
    keep their mined groups.
    """
    from studies.rerank_base import dev_pairs

    if cfg.calibration == "dev-groups":
        return dev_pairs(dev)
    queries, leftover = _dev_candidates(cfg, dev)
    qs = [q.query for q in queries for _ in q.candidates]
    ps = [p.full_text for q in queries for p in q.candidates]
    ys = [int(p.id in q.relevant) for q in queries for p in q.candidates]
    q2, p2, y2 = dev_pairs(leftover)
    return qs + q2, ps + p2, ys + y2


def dev_lists(cfg: RerankDistillConfig, dev: Sequence[dict]) -> list[dict] | None:
    """Reranking samples a student's checkpoint is chosen on (``RerankDistillConfig.select_on``):
    ``dev-candidates``, the dev questions' candidate lists (the kind of list the verdict is read on, in the
    retriever's order); None for ``dev-groups`` (the mined groups, which order students unlike the held-out
    sets do: the teacher's cross-encoder alone leads the teacher there)."""
    if cfg.select_on == "dev-groups":
        return None
    queries, _ = _dev_candidates(cfg, dev)
    return [{"query": q.query, "positive": [p.full_text for p in q.candidates if p.id in q.relevant],
             "documents": [p.full_text for p in q.candidates]} for q in queries]


class _WithoutCosine(BaseRanker):
    """The teacher's cross-encoder alone: its mixed score minus its cosine term (``weight · scale · cosine``),
    both read from :class:`Remembered` rankers, so with records it costs no model forward."""

    score_is_probability = False

    def __init__(self, mixed: BaseRanker, cosine: BaseRanker, factor: float) -> None:
        self.mixed, self.cosine, self.factor = mixed, cosine, factor

    def score(self, query, passages):
        mixed, cosine = self.mixed.score(query, passages), self.cosine.score(query, passages)
        return np.asarray(mixed, dtype=float) - self.factor * np.asarray(cosine, dtype=float)


def student_verdict(by_dataset: dict[str, dict], student: StudentConfig) -> dict:
    """Whether ``student`` ships, judged as it would ship: on int8 ONNX if that variant meets the targets
    itself, else on fp32 (:func:`shortfall`)."""
    int8_key = f"{student.key}-onnx-int8"
    int8_why = shortfall(by_dataset, int8_key, student.tolerance)
    why = int8_why and shortfall(by_dataset, student.key, student.tolerance)
    int8_gap = max(rows[student.key]["nDCG@10"]["mean"] - rows[int8_key]["nDCG@10"]["mean"]
                   for rows in by_dataset.values())
    return {"ship": not why, "why": why or "within target", "backend": "torch" if int8_why else "onnx-int8",
            "int8_why": int8_why or "within target", "int8_max_ndcg10_loss": int8_gap}


def distill_tables(by_dataset: dict[str, dict], students: Sequence[StudentConfig], verdicts: dict,
                   limits: dict | None = None) -> str:
    """Markdown: per student, each held-out set's nDCG@10 (teacher, cosine, student fp32 / int8), the paired
    differences and ECE, from the evaluation rows (:meth:`RerankDistillStudy.evaluate`); the teacher's
    calibration limits (:func:`~studies.rerank_distill_calibration.calibration_transfer`) when given."""
    lines = ["# rerank_distill: held-out tables", "",
             "Written by `ragsieve run experiments/rerank_distill.yaml` (or `--report-only`) from the cached "
             "evaluation. nDCG@10 reranking BM25's top-20; n = queries; every interval and paired difference "
             "resamples whole queries; ECE: 10 equal-width bins of the calibrated probability, every candidate "
             "one pair.", ""]
    if any(CROSS_ALONE in rows for rows in by_dataset.values()):
        lines += ["## Reference: the teacher's cross-encoder alone (its mix minus the cosine term; no training)", "",
                  "| set | n | teacher | cosine | cross-encoder alone | − teacher | − cosine |",
                  "|---|---|---|---|---|---|---|"]
        for name, rows in by_dataset.items():
            if CROSS_ALONE in rows:
                x = rows[CROSS_ALONE]
                lines.append(" | ".join([f"| {name}", str(x["n"]), cell_mean(rows["teacher"]["nDCG@10"]),
                                         cell_mean(rows["cosine"]["nDCG@10"]), cell_mean(x["nDCG@10"]),
                                         cell_diff(x["vs_teacher"]), cell_diff(x["vs_cosine"])]) + " |")
        lines.append("")
    lines += variant_tables(by_dataset)
    if limits:
        lines += limits_tables(limits)
    for student in students:
        key, int8 = student.key, f"{student.key}-onnx-int8"
        v = verdicts[key]
        layers = f"{student.layers} layer{'s' if student.layers != 1 else ''}"
        lines += [f"## `{key}` ({layers}) for `embedded:{student.name}`, tolerance {student.tolerance}",
                  "", f"**{'ships' if v['ship'] else 'missed'}** ({v['why']}); int8: {v['int8_why']}; "
                  f"backend {v['backend']}; largest int8 − fp32 nDCG@10 loss {v['int8_max_ndcg10_loss']:.3f}.", "",
                  "| set | n | teacher | cosine | fp32 | int8 | fp32 − teacher | int8 − teacher | fp32 − cosine "
                  "| int8 − cosine | ECE teacher | ECE fp32 | ECE int8 |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, rows in by_dataset.items():
            t, c, f, q = (rows.get(r) for r in ("teacher", "cosine", key, int8))
            lines.append(" | ".join([
                f"| {name}", str(f["n"]), cell_mean(t["nDCG@10"]), cell_mean(c["nDCG@10"]), cell_mean(f["nDCG@10"]),
                cell_mean(q and q["nDCG@10"]), cell_diff(f["vs_teacher"]), cell_diff(q and q["vs_teacher"]),
                cell_diff(f["vs_cosine"]), cell_diff(q and q["vs_cosine"]), cell_interval(t.get("ece")),
                cell_interval(f.get("ece")), cell_interval(q and q.get("ece"))]) + " |")
        lines.append("")
    return "\n".join(lines)


def _mining_identity(cfg: RerankDistillConfig) -> dict:
    return {"mining": cfg.mining.model_dump()}


class RerankDistillStudy:
    Config = RerankDistillConfig

    def run(self, cfg: RerankDistillConfig, out_dir: Path, console: Console) -> dict:
        from ragsieve.benchmarks.mining import mine_all

        work = Path(out_dir) / "work"
        t0 = time.perf_counter()
        mined = Path(cfg.mined_dir) if cfg.mined_dir else work / "mined"
        self.mined_from_records(cfg, mined, console)
        counts = mine_all(cfg.mining, mined, cfg.data_dir, cfg.datasets)
        self.record_mined(cfg, mined)
        console.print(f"mined rows: {counts}")
        teacher = self.freeze_teacher(cfg, work)
        train, dev = self.teacher_rows(cfg, mined, teacher, work, console)
        result: dict = {"mined_rows": counts, "teacher": str(teacher), "students": {},
                        "evaluation": {"by_dataset": {}, "verdicts": {}}}
        if cfg.teacher_backends:  # the teacher's own rows first: a chosen backend pair may feed teacher_lists
            by_dataset = self.evaluate(cfg, teacher, {}, dev, work, console)["by_dataset"]
            result["teacher_backends"] = choose_backends(cfg, teacher, by_dataset, console)
        result["calibration_limits"] = calibration_limits(cfg, teacher, console)
        if result["calibration_limits"] is not None:  # TABLES.md reads it from here (--report-only too)
            with atomic_file(work / "eval" / "calibration_limits.json") as tmp:
                tmp.write_text(json.dumps(result["calibration_limits"], indent=1))
        taken: dict[str, str] = {}  # asset name → the student that took it
        # per name, fewest layers first: train, evaluate, ship; once one takes the name, the larger ones are
        # not trained (the fastest candidate within target wins, and each larger one costs an hour or more)
        for name in dict.fromkeys(st.name for st in cfg.students):
            for student in sorted((st for st in cfg.students if st.name == name), key=lambda st: st.layers):
                entry = {"name": student.name, "layers": student.layers, "tolerance": student.tolerance,
                         **{k: v for k, v in student.distill_overrides().items() if k != "time_budget_minutes"},
                         **({"fresh_head": True} if student.fresh_head else {}),
                         "shipped": False}
                if name in taken or student.skip:
                    why = f"not trained: {taken[name]} took embedded:{name}" if name in taken else student.skip
                    result["students"][student.key] = {**entry, "trained": False, "why": why}
                    continue
                rows = self.teacher_lists(cfg, train, teacher, work, console, student.lists,
                                          result.get("teacher_backends", {}).get("chosen")) if student.lists else train
                final = self.train(cfg, student, teacher, rows, dev, work, console)
                result["evaluation"] = self.evaluate(cfg, teacher, {student.key: final}, dev, work, console,
                                                     [student], result["evaluation"]["verdicts"])
                verdict = result["evaluation"]["verdicts"][student.key]
                result["students"][student.key] = {**entry, "trained": True, **verdict}
                if student.ship and verdict["ship"]:
                    self.ship(cfg, student, final, teacher, dev, work, result)
                    taken[name] = student.key
                    result["students"][student.key]["shipped"] = True
                    console.print(f"shipped {student.key} as embedded:{student.name}")
                else:
                    console.print(f"{student.key} not shipped: {verdict['why']}")
        result["seconds"] = time.perf_counter() - t0
        # every row evaluated so far (this run's and the cached ones), not only this run's students
        result["evaluation"] = self.report(cfg, out_dir, console)["evaluation"]
        (Path(out_dir) / "metrics.json").write_text(json.dumps(result, indent=2) + "\n")
        return result

    def report(self, cfg: RerankDistillConfig, out_dir: Path, console: Console) -> dict:
        """``TABLES.md`` from the held-out evaluation cached so far (``work/eval``): every student evaluated
        on all sets, with its verdict. Trains and scores nothing (``ragsieve run ... --report-only``)."""
        eval_dir = Path(out_dir) / "work" / "eval"
        by_dataset = {name: json.loads((eval_dir / f"{name}.json").read_text())["rows"]
                      for name in cfg.datasets if (eval_dir / f"{name}.json").is_file()}
        if not by_dataset:
            raise RagsieveError(f"{eval_dir} holds no held-out evaluation yet: run the experiment first")
        return {"evaluation": self._write_tables(cfg, out_dir, by_dataset, console)}

    @staticmethod
    def _write_tables(cfg: RerankDistillConfig, out_dir: Path, by_dataset: dict[str, dict], console: Console) -> dict:
        """``TABLES.md`` for every student evaluated on all sets; returns the rows and those students' verdicts."""
        students = [st for st in cfg.students if len(by_dataset) == len(cfg.datasets)
                    and all(f"{st.key}-onnx-int8" in rows for rows in by_dataset.values())]
        verdicts = {st.key: student_verdict(by_dataset, st) for st in students}
        limits = Path(out_dir) / "work" / "eval" / "calibration_limits.json"
        (Path(out_dir) / "TABLES.md").write_text(distill_tables(
            by_dataset, students, verdicts, json.loads(limits.read_text()) if limits.is_file() else None))
        console.print(f"{Path(out_dir) / 'TABLES.md'}: {', '.join(verdicts) or 'no student evaluated on every set'}")
        return {"by_dataset": by_dataset, "verdicts": verdicts}

    @staticmethod
    def mined_from_records(cfg: RerankDistillConfig, mined: Path, console: Console) -> None:
        """Mined rows absent here but recorded (ids only) are rebuilt from the data instead of mined again."""
        from ragsieve.benchmarks.mining import mined_rows_from_ids
        from ragsieve.data.jsonl import write_jsonl
        from ragsieve.data.score_records import read_id_records, records_match

        folder = Path(cfg.records) / "mined" if cfg.records else None
        if folder is None or not folder.is_dir() or not records_match(folder, _mining_identity(cfg)):
            return
        for name in cfg.datasets:
            ids = read_id_records(folder, name)
            if ids is not None and not (mined / f"{name}.jsonl").exists():
                write_jsonl(mined / f"{name}.jsonl", mined_rows_from_ids(name, cfg.mining, ids, cfg.data_dir))
                console.print(f"mined rows of {name} rebuilt from {folder}")

    @staticmethod
    def record_mined(cfg: RerankDistillConfig, mined: Path) -> None:
        """Record each dataset's mined rows as ids (the text stays in the data) unless recorded already."""
        from ragsieve.benchmarks.mining import mined_ids, read_mined
        from ragsieve.data.score_records import records_match, write_id_records

        folder = Path(cfg.records) / "mined" if cfg.records else None
        if folder is None or not records_match(folder, _mining_identity(cfg)):
            return
        for name in cfg.datasets:
            if not any(folder.glob(f"{name}.*.jsonl.gz")):
                write_id_records(folder, name, [mined_ids(r) for r in read_mined(mined / f"{name}.jsonl")])

    @staticmethod
    def freeze_teacher(cfg: RerankDistillConfig, work: Path) -> Path:
        """A copy of the teacher folder in ``work/teacher``: shipping a student over ``embedded:base``
        must not change the teacher of a resumed or repeated run."""
        import shutil

        from ragsieve.rerank.shipped import ASSET_DIR

        frozen = work / "teacher"
        if not (frozen / "config.json").is_file():
            tmp = work / "teacher.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(Path(cfg.teacher) if cfg.teacher else ASSET_DIR, tmp)
            tmp.rename(frozen)
        return frozen

    @staticmethod
    def teacher_rows(cfg: RerankDistillConfig, mined: Path, teacher: Path, work: Path,
                     console: Console) -> tuple[list[dict], list[dict]]:
        """(train rows capped per dataset, dev rows), each passage scored by the teacher (cached, resumable)."""
        from ragsieve.benchmarks.mining import read_mined
        from ragsieve.data.score_records import PairScores
        from ragsieve.rerank.neural import CrossEncoderRanker
        from ragsieve.rerank.shipped import read_card
        from ragsieve.rerank.training.distill import cache_teacher_scores

        card = read_card(teacher)
        weight, scale = float(card.get("cosine_weight", 0.0)), float(card.get("cosine_scale", 20.0))
        identity = teacher_identity(teacher) if cfg.records else None
        cross = None
        train, dev = [], []
        for name in cfg.datasets:
            rows = read_mined(mined / f"{name}.jsonl")
            rows = [r for r in rows if r["split"] == "train"][: cfg.train_per_dataset] + \
                [r for r in rows if r["split"] == "dev"]
            cache = work / "teacher-scores" / f"{name}.jsonl"

            class _LazyTeacher:  # the cross-encoder loads only when some row is not cached yet
                def predict_pairs(self, pairs):
                    nonlocal cross
                    cross = cross or CrossEncoderRanker(str(teacher), max_length=int(card.get("max_length", 256)))
                    return cross.predict_logits(pairs)

            # the cross-encoder's logit, by (question id, passage id): the cosine mix is recomputed from the rows
            records = PairScores(Path(cfg.records) / "teacher", name, identity) if identity else None
            scored = cache_teacher_scores(rows, _LazyTeacher(), cache, weight, scale, records=records)
            train += [r for r in scored if r["split"] == "train"]
            dev += [r for r in scored if r["split"] == "dev"]
            console.print(f"teacher scores: {name} {len(scored)} rows")
        return train, dev

    def teacher_lists(self, cfg: RerankDistillConfig, train: list[dict], teacher: Path, work: Path, console: Console,
                      per_dataset: int, backends: str | None = None) -> list[dict]:
        """Training rows from candidate lists: for the first ``per_dataset`` train questions of each dataset, the
        list the held-out evaluation would rerank for it (:func:`ranking_queries`), every candidate scored by the
        teacher (its shipped mix on ``backends``, "<cross-encoder>+<cosine>"; default fp32), as mined rows whose
        positive is the teacher's top candidate and whose negatives are the rest: the listwise KL then learns the
        teacher's order on the lists it will be judged on, and InfoNCE its top pick. A dataset without such lists
        (the HotpotQA 1,517 pool) keeps its ``train`` rows (the mined groups). Scores are recorded by
        (question id, passage id) in ``<records>/teacher-lists`` (``work/teacher-lists`` without records), added
        every 16 questions, so a killed run resumes."""
        from ragsieve.benchmarks.mining import held_out_sources
        from ragsieve.benchmarks.relevance import ranking_queries
        from ragsieve.data import load_dataset
        from ragsieve.data.score_records import PairScores
        from ragsieve.rerank.shipped import load_shipped_reranker

        cross_backend, cosine_backend = (backends or "torch+torch").split("+")
        identity = {**teacher_scores_identity(cfg.encoder, teacher), "lists": "train questions' candidate lists",
                    "backends": f"{cross_backend}+{cosine_backend}"}
        folder = Path(cfg.records) / "teacher-lists" if cfg.records else work / "teacher-lists"
        sources, ranker, rows = held_out_sources(), None, []
        by_dataset: dict[str, list[dict]] = {}
        for r in train:
            by_dataset.setdefault(r.get("dataset", ""), []).append(r)
        for name, mined in by_dataset.items():
            if name not in sources:  # no lists for it (the HotpotQA 1,517 pool): its mined groups stay
                rows += mined
                console.print(f"teacher lists: {name} has none; its {len(mined)} mined groups stay")
                continue
            qids = list(dict.fromkeys(r["qid"] for r in mined))[:per_dataset]
            ds = load_dataset(name, data_dir=cfg.data_dir)
            by_id = {q.id: q for q in ds.questions}
            queries = ranking_queries(ds, [by_id[i] for i in qids if i in by_id], sources[name])
            recorded = PairScores(folder, name, identity)
            todo = [q for q in queries if recorded.lookup(q.query_id, [p.id for p in q.candidates]) is None]
            for lo in range(0, len(todo), 16):
                chunk = todo[lo: lo + 16]
                ranker = ranker or load_shipped_reranker(teacher, backend=cross_backend, cosine_backend=cosine_backend)
                scores = ranker.score_pairs([q.query for q in chunk for _ in q.candidates],
                                            [p for q in chunk for p in q.candidates])
                recorded.add((q.query_id, p.id, s) for (q, p), s in
                             zip([(q, p) for q in chunk for p in q.candidates], scores))
            for q in queries:
                scored = sorted(zip(recorded.lookup(q.query_id, [p.id for p in q.candidates]), q.candidates),
                                key=lambda sp: -sp[0])
                if len(scored) >= 2:
                    docs = [(p.id, p.full_text, float(s)) for s, p in scored]
                    rows.append({"dataset": name, "qid": q.query_id, "query": q.query, "split": "train",
                                 "pos": docs[:1], "neg": docs[1:]})
            console.print(f"teacher lists: {name} {len(queries)} questions ({len(todo)} scored now)")
        return rows

    @staticmethod
    def train(cfg: RerankDistillConfig, student: StudentConfig, teacher: Path, train: list[dict], dev: list[dict],
              work: Path, console: Console) -> Path:
        from ragsieve.rerank.training.distill import train_distilled, truncated_student

        out = work / "students" / student.key
        final = out / "final"
        if (final / "config.json").exists():
            return final
        init = truncated_student(teacher, student.layers, out / "init", cfg.distill.max_length, student.fresh_head)
        console.print(f"training {student.key} on {len(train)} rows, dev {len(dev)}")
        t = time.perf_counter()
        lists = dev_lists(cfg, dev)
        if lists is not None:
            console.print(f"{student.key}: best checkpoint by nDCG@10 on {len(lists)} dev questions' candidate lists"
                          " (less those without both a relevant and an irrelevant passage)")
        train_distilled(train, dev, cfg.distill.model_copy(update={"init": str(init), **student.distill_overrides()}),
                        out, dev_lists=lists)
        (out / "train_seconds.txt").write_text(f"{time.perf_counter() - t:.0f}\n")
        return final


    @staticmethod
    def references(cfg: RerankDistillConfig, teacher: Path, queries, dataset: str = "") -> dict[str, BaseRanker]:
        """Teacher (its shipped mix and calibration), MiniLM cosine over ``queries``' candidates and, for a
        mixed teacher, its cross-encoder alone (``teacher-cross-encoder``: the mix minus the cosine term) and its
        variants (:func:`~studies.rerank_distill_backends.teacher_variants`). With
        ``cfg.records``, their held-out scores (which never change) are read from and added to
        ``<records>/eval-teacher`` and ``<records>/eval-cosine``."""
        from ragsieve.data.score_records import PairScores
        from ragsieve.rerank.mixed import CosineMixRanker
        from ragsieve.rerank.shipped import load_shipped_reranker, read_card
        from studies.rerank_base import CosineOverCandidates

        card = read_card(teacher)
        cosine = CosineOverCandidates(cfg.encoder, queries)
        shipped = load_shipped_reranker(teacher, backend="torch")
        mix = CosineMixRanker(shipped.cross, float(card.get("cosine_weight", 0.0)),
                              float(card.get("cosine_scale", 20.0)), cosine=cosine) \
            if isinstance(shipped, CosineMixRanker) else shipped
        mix.calibration = shipped.calibration
        recorded: dict = {"teacher": None, "cosine": None}
        if cfg.records and dataset:
            ids = {q.query: q.query_id for q in queries}
            recorded = {r: (PairScores(Path(cfg.records) / f"eval-{r}", dataset, identity), ids) for r, identity in (
                ("teacher", teacher_scores_identity(cfg.encoder, teacher)),
                ("cosine", {"encoder": cfg.encoder}))}
        out = {r: Remembered(ranker, r, *(recorded[r] or ())) for r, ranker in (("teacher", mix), ("cosine", cosine))}
        if isinstance(mix, CosineMixRanker) and mix.weight:  # what dropping the second model costs, untrained
            factor = mix.weight * mix.scale
            out[CROSS_ALONE] = _WithoutCosine(out["teacher"], out["cosine"], factor)
            out.update(teacher_variants(cfg, teacher, queries, mix, shipped.calibration, out))
        return out

    @staticmethod
    def students(cfg: RerankDistillConfig, finals: dict[str, Path], dev: list[dict]) -> dict[str, Remembered]:
        """Each student on fp32 and on int8 ONNX, calibrated on :func:`calibration_pairs` (≈ 4k dev pairs)."""
        from ragsieve.models.onnx import ONNX_BATCH
        from ragsieve.rerank.neural import CrossEncoderRanker

        out: dict[str, Remembered] = {}
        qs, ps, ys = calibration_pairs(cfg, dev)
        for name, final in finals.items():
            student = CrossEncoderRanker(str(final), max_length=cfg.distill.max_length)
            try:
                student.calibrate(qs, ps, ys)
            except RagsieveError as exc:  # an untrained (smoke-test) student: ECE of its sigmoid instead
                log.warning("%s: no calibration (%s)", name, exc)
            out[name] = Remembered(student, name)
            # the same weights on the int8 per-channel ONNX forward, with the fp32 calibration (same logit scale)
            int8 = CrossEncoderRanker(str(final), max_length=cfg.distill.max_length, backend="onnx-int8",
                                      batch_size=ONNX_BATCH)  # batched as the shipped ONNX ranker batches
            int8.calibration = student.calibration
            out[f"{name}-onnx-int8"] = Remembered(int8, f"{name}-onnx-int8")
        return out

    def evaluate(self, cfg: RerankDistillConfig, teacher: Path, finals: dict[str, Path], dev: list[dict],
                 work: Path, console: Console, students: Sequence[StudentConfig] = (),
                 verdicts: dict | None = None) -> dict:
        """Held-out nDCG@10 per set and ranker, paired differences (queries resampled), ECE, and the ship
        verdicts of ``students`` (added to ``verdicts``). Each set's per-query values and rows are cached in
        ``work/eval/<set>.json`` and extended ranker by ranker, so a student evaluated later is compared
        with the teacher and cosine on the same queries without scoring them again."""
        from ragsieve.benchmarks.forgetting import heldout_queries
        from ragsieve.benchmarks.relevance import per_query
        from ragsieve.eval.stats import bootstrap_ci, paired_bootstrap
        from ragsieve.rerank.shipped import read_card

        out: dict = {"by_dataset": {}, "verdicts": dict(verdicts or {})}
        students_by_key: dict[str, Remembered] | None = None
        mixed = float(read_card(teacher).get("cosine_weight", 0.0)) > 0  # then references() adds CROSS_ALONE
        wanted = ["teacher", "cosine", *([CROSS_ALONE, *map(variant_key, cfg.teacher_backends),
                                          *map(window_key, cfg.teacher_windows),
                                          *([BEST_CHUNK] if cfg.teacher_best_chunk else [])] if mixed else []),
                  *(k for key in finals for k in (key, f"{key}-onnx-int8"))]
        for name in cfg.datasets:
            cache = work / "eval" / f"{name}.json"
            stored = json.loads(cache.read_text()) if cache.is_file() else {"per_query": {}, "rows": {}}
            missing = [r for r in wanted if r not in stored["rows"]]
            if missing:
                queries = heldout_queries(name, cfg.data_dir, cfg.seed, cfg.eval_queries)
                qids = [q.query_id for q in queries]
                if students_by_key is None:  # built (calibrated, exported) once for all sets
                    students_by_key = self.students(cfg, finals, dev)
                for ranker in students_by_key.values():
                    ranker.memo.clear()  # one set's scores at a time
                rankers = {r: ranker for r, ranker in {**self.references(cfg, teacher, queries, name),
                                                        **students_by_key}.items() if r in missing}
                per = stored["per_query"]
                for r, ranker in rankers.items():
                    per[r] = per_query(ranker, queries, ks=(10,), measures=("nDCG",))["nDCG@10"]
                for r in rankers:
                    v = np.array([per[r][q] for q in qids])
                    est, lo, hi = bootstrap_ci(v, n_boot=cfg.bootstrap, seed=cfg.seed)
                    row = {"n": len(qids), "nDCG@10": {"mean": est, "low": lo, "high": hi}}
                    for ref in ("teacher", "cosine"):
                        if r != ref:
                            row[f"vs_{ref}"] = paired_bootstrap(
                                v, [per[ref][q] for q in qids], n_boot=cfg.bootstrap, seed=cfg.seed).to_dict()
                    if r not in ("cosine", CROSS_ALONE):  # ECE from the memo's scores: costs nothing more
                        row["ece"] = heldout_calibration(rankers[r], [name], cfg.eval_queries, cfg.ece_bins,
                                                         cfg.bootstrap, cfg.seed, cfg.data_dir)[name]["ece"]
                    stored["rows"][r] = row
                cache.parent.mkdir(parents=True, exist_ok=True)
                with atomic_file(cache) as tmp:
                    tmp.write_text(json.dumps(stored))
                console.print(name, {r: round(stored["rows"][r]["nDCG@10"]["mean"], 3) for r in rankers})
            out["by_dataset"][name] = stored["rows"]
        for student in students:
            out["verdicts"][student.key] = student_verdict(out["by_dataset"], student)
        return out

    @staticmethod
    def ship(cfg: RerankDistillConfig, student: StudentConfig, final: Path, teacher: Path, dev: list[dict],
             work: Path, result: dict) -> Path:
        """fp16 weights + int8 ONNX + a card (single forward: no cosine; calibration fitted on dev)."""
        from ragsieve.rerank.calibration import Calibration
        from ragsieve.rerank.neural import CrossEncoderRanker
        from ragsieve.rerank.shipped import CARD, embedded_reranker_dir, write_asset
        qs, ps, ys = calibration_pairs(cfg, dev)
        logits = CrossEncoderRanker(str(final), max_length=cfg.distill.max_length).predict_logits(list(zip(qs, ps)))
        cal = Calibration.fit(logits, ys)
        card = {
            "recipe": {"experiment": "rerank_distill",
                       "params": cfg.model_dump(exclude={"data_dir", "asset_root"}), "student": student.model_dump()},
            "max_length": cfg.distill.max_length,
            "default_backend": result["evaluation"]["verdicts"].get(student.key, {}).get("backend", "torch"),
            "distilled_from": json.loads((teacher / CARD).read_text()).get("recipe", {}).get("experiment", "teacher"),
            "calibration": {"temperature": cal.temperature, "bias": cal.bias,
                            "fitted_on": f"{len(ys)} dev pairs ({int(sum(ys))} relevant, {cfg.calibration}), "
                                         "on the logit"},
            "heldout_ndcg10": {name: {r: round(v["nDCG@10"]["mean"], 4) for r, v in rows.items()}
                               for name, rows in result["evaluation"]["by_dataset"].items()},
        }
        folder = embedded_reranker_dir(student.name)
        target = Path(cfg.asset_root) / folder.name if cfg.asset_root else folder
        return write_asset(final, target, card)
