"""Loaders for the benchmark files in the shared data directory (see its README.md).

Each loader is registered under a dataset name with :func:`register_dataset` and turns
the raw files into a :class:`Dataset`. Ids are deterministic strings: the upstream id
where the data has one, otherwise a short SHA-1 of the content, so they survive
re-ordering of the files. Pool passages are de-duplicated by ``(title, text)``;
judgments and gold ids always point at the surviving passage.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragsieve.data.jsonl import JsonlReader
from ragsieve.data.records import Dataset, Judgment, LabeledPair, Passage, Question
from ragsieve.errors import DataError
from ragsieve.paths import REPO_DIR
from ragsieve.text_input import read_text

__all__ = [
    "DATASET_LICENCES",
    "DatasetInfo",
    "available_datasets",
    "dataset_info",
    "dataset_licence",
    "default_data_dir",
    "load_dataset",
    "register_dataset",
]

log = logging.getLogger(__name__)

# Short licence notes, from the data README; ANLI is non-commercial.
DATASET_LICENCES: dict[str, str] = {
    "nq-open": "CC BY-SA 3.0",
    "nq-oracle": "MIT (lost-in-the-middle code); data CC BY-SA 3.0",
    "hotpotqa": "CC BY-SA 4.0",
    "hotpotqa-distractor": "CC BY-SA 4.0",
    "fever": "CC BY-SA 3.0 (Wikipedia)",
    "multirc": "MultiRC research licence (see upstream)",
    "pubmedqa": "MIT",
    "bioasq": "BioASQ terms of use (research only; see bioasq/readme.txt)",
    "anli": "CC BY-NC 4.0 (non-commercial: experiments only)",
}


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class DatasetInfo:
    """A registered dataset: its loader, the files it reads and its licence."""

    name: str
    files: tuple[str, ...]
    description: str
    loader: Callable[[_Ctx], Dataset]

    @property
    def licence(self) -> str:
        return DATASET_LICENCES.get(self.name, "unknown (check upstream)")


_REGISTRY: dict[str, DatasetInfo] = {}


def register_dataset(name: str, files: tuple[str, ...] = (), description: str = "") -> Callable:
    """Decorator registering ``fn(ctx) -> Dataset`` under ``name``."""

    def deco(fn: Callable[[_Ctx], Dataset]) -> Callable[[_Ctx], Dataset]:
        if name in _REGISTRY:
            raise ValueError(f"dataset {name!r} registered twice")
        doc = description or next(iter((fn.__doc__ or "").strip().splitlines()), "")
        _REGISTRY[name] = DatasetInfo(name, tuple(files), doc, fn)
        return fn

    return deco


def available_datasets() -> list[str]:
    """Names accepted by :func:`load_dataset`, sorted."""
    return sorted(_REGISTRY)


def dataset_info(name: str) -> DatasetInfo:
    """The registry entry for ``name``; :class:`DataError` if unknown."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise DataError(f"unknown dataset {name!r}; available: {', '.join(available_datasets())}") from None


def dataset_licence(name: str) -> str:
    """Short licence note for ``name`` (also in ``Dataset.meta['licence']``)."""
    return dataset_info(name).licence


def default_data_dir() -> Path:
    """``$RAGSIEVE_DATA`` if set, else ``<repo>/../shared/data``; :class:`DataError` if missing."""
    env = os.environ.get("RAGSIEVE_DATA")
    path = Path(env).expanduser() if env else REPO_DIR.parent / "shared" / "data"
    return _check_dir(path)


def _check_dir(path: Path) -> Path:
    if not path.is_dir():
        raise DataError(f"data directory {path} not found; set RAGSIEVE_DATA or pass --data-dir")
    return path


def load_dataset(name: str, data_dir: str | os.PathLike[str] | None = None, skip_bad: bool = False) -> Dataset:
    """Load a registered dataset from ``data_dir`` (default :func:`default_data_dir`).

    ``skip_bad`` skips malformed JSON lines (counted in ``Dataset.skipped_lines``).
    ``Dataset.meta`` carries the licence, source files and any dropped/repaired counts.
    """
    info = dataset_info(name)
    root = _check_dir(Path(data_dir).expanduser()) if data_dir is not None else default_data_dir()
    ctx = _Ctx(root, skip_bad)
    ds = info.loader(ctx)
    ds.skipped_lines = ctx.skipped
    ds.meta = {"licence": info.licence, "files": list(ctx.files), **ctx.notes, **ds.meta}
    return ds


# --------------------------------------------------------------------------- helpers


class _Ctx:
    """What a loader gets: file access that raises one-line errors, and stats."""

    def __init__(self, root: Path, skip_bad: bool) -> None:
        self.root = root
        self.skip_bad = skip_bad
        self.skipped = 0
        self.files: list[str] = []
        self.notes: dict[str, Any] = {}

    def path(self, rel: str) -> Path:
        path = self.root / rel
        if not path.is_file():
            raise DataError(f"data file {path} not found; check the data directory ({self.root})")
        self.files.append(rel)
        return path

    def jsonl(self, rel: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """Yield ``("file:line", row)``; malformed lines raise or are counted."""
        reader = JsonlReader(self.path(rel), skip_bad=self.skip_bad)
        try:
            for lineno, row in reader.numbered():
                yield f"{reader.path}:{lineno}", row
        finally:
            self.skipped += reader.skipped

    def json(self, rel: str) -> Any:
        path = self.path(rel)
        try:
            return json.loads(read_text(path))
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: malformed JSON ({e.msg} at column {e.colno})") from None

    def csv(self, rel: str, required: tuple[str, ...]) -> Iterator[tuple[str, dict[str, str]]]:
        """Yield ``("file:row", row)`` for a header CSV with the ``required`` columns."""
        path = self.path(rel)
        with io.StringIO(read_text(path), newline="") as fh:  # the shared UTF-8 policy
            reader = csv.DictReader(fh)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise DataError(f"{path}: missing CSV column(s) {', '.join(missing)}")
            try:
                for row in reader:
                    # reader.line_num is the physical line; rows may span lines (quoted newlines)
                    yield f"{path}:{reader.line_num}", row
            except csv.Error as e:
                raise DataError(f"{path}:{reader.line_num}: malformed CSV ({e})") from None


def _get(row: Any, key: str, where: str, kind: type | tuple[type, ...] | None = None) -> Any:
    if not isinstance(row, dict) or key not in row:
        raise DataError(f"{where}: missing field {key!r}")
    value = row[key]
    if kind is not None and not isinstance(value, kind):
        raise DataError(f"{where}: field {key!r} should be {_kind_name(kind)}, got {type(value).__name__}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in kind) if isinstance(kind, tuple) else kind.__name__


def _sha(text: str, n: int = 12) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:n]


def _uniq(items: Any) -> tuple:
    """Order-preserving de-duplication."""
    return tuple(dict.fromkeys(items))


class _Pool:
    """Passage pool de-duplicated by ``(title, text)``; the first id of a duplicate wins."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.passages: list[Passage] = []
        self._by_key: dict[tuple[str, str], str] = {}
        self._ids: set[str] = set()
        self.duplicates = 0

    def add(self, text: str, title: str = "", pid: str | None = None) -> str:
        """Add a passage (if new) and return the id it is known by."""
        key = (title, text)
        known = self._by_key.get(key)
        if known is not None:
            self.duplicates += 1
            return known
        digest = _sha(f"{title}\x00{text}")
        if pid is None:
            pid = f"{self.prefix}{digest}"
        if pid in self._ids:  # same natural id, different content: disambiguate by content
            pid = f"{pid}#{digest[:8]}"
        self._by_key[key] = pid
        self._ids.add(pid)
        self.passages.append(Passage(id=pid, text=text, title=title))
        return pid


class _Judgments:
    """Judgments de-duplicated per (query, passage), keeping the highest label."""

    def __init__(self) -> None:
        self._labels: dict[tuple[str, str], int] = {}

    def add(self, query_id: str, passage_id: str, label: int) -> None:
        key = (query_id, passage_id)
        self._labels[key] = max(label, self._labels.get(key, label))

    def as_list(self) -> list[Judgment]:
        return [Judgment(q, p, lab) for (q, p), lab in self._labels.items()]


class _Ids:
    """Makes ids unique within a dataset: a repeat gets ``~2``, ``~3``, ...; counts repeats."""

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}
        self.repeats = 0

    def __call__(self, id_: str) -> str:
        n = self._seen.get(id_, 0) + 1
        self._seen[id_] = n
        if n == 1:
            return id_
        self.repeats += 1
        return f"{id_}~{n}"


def _nq_qid(question: str) -> str:
    # content hash: NQ files have no ids, and this makes nq-open and nq-oracle ids agree
    return f"nq:{_sha(question.strip())}"


def _str_list(value: Any, where: str, key: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DataError(f"{where}: field {key!r} should be a list of strings")
    return tuple(value)


# --------------------------------------------------------------------------- datasets


@register_dataset("nq-open", files=("nq/NQ-open.dev.jsonl",))
def _load_nq_open(ctx: _Ctx) -> Dataset:
    """NQ-open dev questions with answer lists; no passages."""
    questions = []
    ids = _Ids()
    for row_no, (where, row) in enumerate(ctx.jsonl("nq/NQ-open.dev.jsonl")):
        text = _get(row, "question", where, str)
        answers = _str_list(_get(row, "answer", where), where, "answer")
        questions.append(Question(ids(_nq_qid(text)), text, answers, meta={"row": row_no}))
    ctx.notes["repeated_question_ids"] = ids.repeats
    return Dataset("nq-open", questions)


@register_dataset("nq-oracle", files=("nq/nq-open-oracle.jsonl.gz",))
def _load_nq_oracle(ctx: _Ctx) -> Dataset:
    """NQ-open questions each with its gold Wikipedia passage; pool = all gold passages."""
    pool = _Pool("wiki:")
    judg = _Judgments()
    ids = _Ids()
    questions = []
    for where, row in ctx.jsonl("nq/nq-open-oracle.jsonl.gz"):
        text = _get(row, "question", where, str)
        answers = _str_list(_get(row, "answers", where), where, "answers")
        qid = ids(_nq_qid(text))
        gold = []
        for c in _get(row, "ctxs", where, list):
            if not c.get("isgold", True):
                continue
            pid = pool.add(_get(c, "text", where, str), _get(c, "title", where, str))
            gold.append(pid)
            judg.add(qid, pid, 1)
        questions.append(Question(qid, text, answers, _uniq(gold)))
    ctx.notes["repeated_question_ids"] = ids.repeats
    ctx.notes["duplicate_passages_merged"] = pool.duplicates
    return Dataset("nq-oracle", questions, pool.passages, judg.as_list())


@register_dataset("hotpotqa", files=("hotpotqa/hotpot_dev_v1_simplified.json",))
def _load_hotpotqa(ctx: _Ctx) -> Dataset:
    """HotpotQA dev (simplified, no context): question, answer, type."""
    rel = "hotpotqa/hotpot_dev_v1_simplified.json"
    data = ctx.json(rel)
    if not isinstance(data, list):
        raise DataError(f"{ctx.root / rel}: expected a JSON list of questions")
    ids = _Ids()
    questions = []
    for i, row in enumerate(data):
        where = f"{ctx.root / rel}: item {i}"
        text = _get(row, "question", where, str)
        answer = _get(row, "answer", where, str)
        # content hash so the ids match across re-orderings; the file has no ids
        qid = ids(row.get("id") or row.get("_id") or f"hotpot:{_sha(text.strip())}")
        questions.append(Question(qid, text, (answer,), meta={"type": row.get("type", "")}))
    ctx.notes["repeated_question_ids"] = ids.repeats
    return Dataset("hotpotqa", questions)


@register_dataset("hotpotqa-distractor", files=("hotpotqa/hotpot_dev_distractor_sample100.jsonl",))
def _load_hotpotqa_distractor(ctx: _Ctx) -> Dataset:
    """100 hard HotpotQA distractor questions, 10 paragraphs each, sentence-level support."""
    pool = _Pool()
    judg = _Judgments()
    ids = _Ids()
    questions: list[Question] = []
    pairs: list[LabeledPair] = []
    for where, row in ctx.jsonl("hotpotqa/hotpot_dev_distractor_sample100.jsonl"):
        qid = ids(str(_get(row, "id", where)))
        text = _get(row, "question", where, str)
        context = _get(row, "context", where, dict)
        titles = _get(context, "title", where, list)
        sentences = _get(context, "sentences", where, list)
        if len(titles) != len(sentences):
            raise DataError(f"{where}: context has {len(titles)} titles but {len(sentences)} sentence lists")
        sf = _get(row, "supporting_facts", where, dict)
        sf_titles, sf_sents = _get(sf, "title", where, list), _get(sf, "sent_id", where, list)
        support = set(zip(sf_titles, (int(s) for s in sf_sents)))
        candidate_ids = []
        for title, sents in zip(titles, sentences):
            # HotpotQA sentences carry their own leading spaces
            candidate_ids.append(pool.add("".join(sents).strip(), title, pid=title))
        gold_titles = _uniq(sf_titles)
        unknown = [t for t in gold_titles if t not in titles]
        if unknown:
            raise DataError(f"{where}: supporting fact title {unknown[0]!r} is not among the context titles")
        gold = _uniq(candidate_ids[titles.index(t)] for t in gold_titles)
        for pid in candidate_ids:
            judg.add(qid, pid, int(pid in gold))
        for pi, (title, sents) in enumerate(zip(titles, sentences)):
            for si, sent in enumerate(sents):
                sent = sent.strip()
                is_support = (title, si) in support
                if not sent and not is_support:
                    continue
                pairs.append(LabeledPair.named(f"{qid}:{pi}:{si}", ("question", text), ("sentence", sent),
                                               int(is_support), query_id=qid))
        meta = {
            "type": row.get("type", ""),
            "level": row.get("level", ""),
            "candidate_ids": candidate_ids,
            "supporting_sentences": [[candidate_ids[titles.index(t)], int(s)] for t, s in zip(sf_titles, sf_sents)],
        }
        questions.append(Question(qid, text, (str(_get(row, "answer", where)),), gold, meta))
    ctx.notes["duplicate_passages_merged"] = pool.duplicates
    return Dataset("hotpotqa-distractor", questions, pool.passages, judg.as_list(), pairs)


@register_dataset("fever", files=("fever/val.jsonl", "fever/docs.jsonl"))
def _load_fever(ctx: _Ctx) -> Dataset:
    """FEVER (ERASER) validation claims; pool = sentences of the referenced Wikipedia docs."""
    claims = list(ctx.jsonl("fever/val.jsonl"))
    docs: dict[str, str] = {}
    for where, row in ctx.jsonl("fever/docs.jsonl"):
        docs.setdefault(_get(row, "docid", where, str), _get(row, "text", where, str))

    def doc_text(docid: str) -> str | None:
        # the packed docs lost trailing dots of ids (file-name limits): "Juventus_F.C." -> "Juventus_F.C"
        text = docs.get(docid)
        return text if text is not None else docs.get(docid.rstrip("."))

    referenced: dict[str, None] = {}
    for where, row in claims:
        for d in row.get("docids") or []:
            referenced[d] = None
        for group in _get(row, "evidences", where, list):
            for ev in group:
                referenced[_get(ev, "docid", where, str)] = None

    pool = _Pool()
    sent_ids: dict[tuple[str, int], str] = {}  # (docid, sentence index) -> surviving passage id
    missing_docs = []
    for docid in referenced:
        text = doc_text(docid)
        if text is None:
            missing_docs.append(docid)
            continue
        title = docid.replace("_", " ")
        for si, sent in enumerate(text.split("\n")):
            sent_ids[(docid, si)] = pool.add(sent.strip(), title, pid=f"{docid}:{si}")

    judg = _Judgments()
    ids = _Ids()
    questions: list[Question] = []
    pairs: list[LabeledPair] = []
    evidence_only = 0
    for where, row in claims:
        qid = ids(str(_get(row, "annotation_id", where)))
        claim = _get(row, "query", where, str)
        label = _get(row, "classification", where, str)
        groups: list[list[str]] = []
        for group in row["evidences"]:
            gids = []
            for ev in group:
                docid, ev_text = ev["docid"], _get(ev, "text", where, str).strip()
                si = int(_get(ev, "start_sentence", where, int))
                pid = sent_ids.get((docid, si))
                if pid is None:
                    # doc absent from docs.jsonl: keep the evidence sentence itself in the pool
                    pid = pool.add(ev_text, docid.replace("_", " "), pid=f"{docid}:{si}")
                    sent_ids[(docid, si)] = pid
                    evidence_only += 1
                gids.append(pid)
                judg.add(qid, pid, 1)
            groups.append(gids)
        gold = _uniq(pid for g in groups for pid in g)
        meta = {"docids": list(row.get("docids") or []), "evidence_groups": groups}
        questions.append(Question(qid, claim, (label,), gold, meta))
        if label in ("SUPPORTS", "REFUTES") and row["evidences"]:
            evidence = " ".join(ev["text"].strip() for ev in row["evidences"][0])
            pairs.append(
                LabeledPair.named(qid, ("claim", claim), ("evidence", evidence), int(label == "SUPPORTS"))
            )
    if missing_docs:
        log.info("fever: %d referenced docs missing from docs.jsonl", len(missing_docs))
    ctx.notes.update(
        docs_in_file=len(docs),
        docs_referenced=len(referenced),
        docs_missing=missing_docs,
        evidence_only_passages=evidence_only,
        duplicate_passages_merged=pool.duplicates,
        repeated_question_ids=ids.repeats,
    )
    return Dataset("fever", questions, pool.passages, judg.as_list(), pairs)


@register_dataset("multirc", files=("multirc/train.jsonl", "multirc/val.jsonl"))
def _load_multirc(ctx: _Ctx) -> Dataset:
    """MultiRC (SuperGLUE): passage / question / candidate answer pairs, train + val.

    A pair's ``query`` is ``"{question} {answer}"`` (the label depends on the answer);
    templates should prefer ``fields``.
    """
    pool = _Pool()
    judg = _Judgments()
    questions: list[Question] = []
    pairs: list[LabeledPair] = []
    for split in ("train", "val"):
        for where, row in ctx.jsonl(f"multirc/{split}.jsonl"):
            pidx = _get(row, "idx", where)
            passage = _get(row, "passage", where, dict)
            ptext = _get(passage, "text", where, str).strip()
            pid = pool.add(ptext, pid=f"{split}:{pidx}")
            for qn, q in enumerate(_get(passage, "questions", where, list)):
                qid = f"{split}:{pidx}:{q.get('idx', qn)}"
                qtext = _get(q, "question", where, str)
                answers = _get(q, "answers", where, list)
                true = []
                for an, a in enumerate(answers):
                    atext = _get(a, "text", where, str)
                    label = int(_get(a, "label", where, (int, bool)))
                    if label:
                        true.append(atext)
                    pairs.append(
                        LabeledPair(
                            id=f"{qid}:{a.get('idx', an)}",
                            query_id=qid,
                            query=f"{qtext} {atext}",
                            passage=ptext,
                            label=label,
                            fields={"passage": ptext, "question": qtext, "answer": atext},
                            group=split,
                        )
                    )
                questions.append(Question(qid, qtext, tuple(true), (pid,), {"split": split}))
                judg.add(qid, pid, 1)
    ctx.notes["duplicate_passages_merged"] = pool.duplicates
    return Dataset("multirc", questions, pool.passages, judg.as_list(), pairs)


@register_dataset("pubmedqa", files=("pubmedqa/ori_pqal.json", "pubmedqa/test_ground_truth.json"))
def _load_pubmedqa(ctx: _Ctx) -> Dataset:
    """PubMedQA PQA-L: yes/no/maybe questions over abstract sections; 'maybe' has no pair."""
    data = ctx.json("pubmedqa/ori_pqal.json")
    test = ctx.json("pubmedqa/test_ground_truth.json")
    if not isinstance(data, dict) or not isinstance(test, dict):
        raise DataError(f"{ctx.root / 'pubmedqa'}: expected JSON objects keyed by PMID")
    pool = _Pool()
    judg = _Judgments()
    questions: list[Question] = []
    pairs: list[LabeledPair] = []
    dropped_maybe = 0
    for pmid, row in data.items():
        where = f"{ctx.root / 'pubmedqa/ori_pqal.json'}: PMID {pmid}"
        text = _get(row, "QUESTION", where, str)
        decision = _get(row, "final_decision", where, str)
        contexts = _get(row, "CONTEXTS", where, list)
        labels = row.get("LABELS") or [""] * len(contexts)
        if len(labels) != len(contexts):
            raise DataError(f"{where}: {len(contexts)} CONTEXTS but {len(labels)} LABELS")
        group = "test" if pmid in test else "train"
        gold = _uniq(pool.add(c.strip(), str(lab), pid=f"{pmid}:{i}") for i, (c, lab) in enumerate(zip(contexts, labels)))
        for pid in gold:
            judg.add(pmid, pid, 1)
        meta = {"group": group, "long_answer": row.get("LONG_ANSWER", ""), "year": row.get("YEAR", "")}
        questions.append(Question(pmid, text, (decision,), gold, meta))
        if decision not in ("yes", "no"):
            dropped_maybe += 1
            continue
        context = " ".join(c.strip() for c in contexts)
        pairs.append(
            LabeledPair.named(pmid, ("question", text), ("context", context), int(decision == "yes"), group=group)
        )
    ctx.notes.update(
        maybe_pairs_dropped=dropped_maybe,
        duplicate_passages_merged=pool.duplicates,
        test_ids_not_in_data=len(set(test) - set(data)),
    )
    return Dataset("pubmedqa", questions, pool.passages, judg.as_list(), pairs)


_BIOASQ_FILE = re.compile(r"^(\d+)B(\d+)_golden\.json$")


def _flatten_strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        if value.strip():
            yield value.strip()
    elif isinstance(value, list):
        for v in value:
            yield from _flatten_strings(v)


@register_dataset("bioasq", files=("bioasq/*_golden.json",))
def _load_bioasq(ctx: _Ctx) -> Dataset:
    """BioASQ Task B golden sets: questions, exact answers and relevant PubMed snippets."""
    folder = ctx.root / "bioasq"
    batches = sorted(
        ((int(m[1]), int(m[2]), p.name) for p in folder.glob("*_golden.json") if (m := _BIOASQ_FILE.match(p.name))),
    )
    if not batches:
        raise DataError(f"no BioASQ *_golden.json files found in {folder}")
    pool = _Pool("bioasq:")
    judg = _Judgments()
    questions: list[Question] = []
    seen: set[str] = set()
    repeated = 0
    for _, _, fname in batches:  # chronological, so "keep the first" keeps the oldest batch
        batch = fname.removesuffix("_golden.json")
        data = ctx.json(f"bioasq/{fname}")
        for i, q in enumerate(_get(data, "questions", f"{folder / fname}", list)):
            where = f"{folder / fname}: question {i}"
            body = _get(q, "body", where, str).strip()
            qid = str(q.get("id") or f"bioasq:{_sha(body)}")
            if qid in seen:
                repeated += 1
                continue
            seen.add(qid)
            gold = _uniq(
                pool.add(_get(s, "text", where, str).strip())
                for s in q.get("snippets") or []
                if str(s.get("text", "")).strip()
            )
            for pid in gold:
                judg.add(qid, pid, 1)
            answers = _uniq(_flatten_strings(q.get("exact_answer")))
            if q.get("type") == "yesno":  # one golden file says "Yes"
                answers = tuple(a.lower() for a in answers)
            meta = {"batch": batch, "type": q.get("type", ""), "ideal_answer": q.get("ideal_answer")}
            questions.append(Question(qid, body, answers, gold, meta))
    ctx.notes.update(repeated_questions_dropped=repeated, duplicate_passages_merged=pool.duplicates)
    return Dataset("bioasq", questions, pool.passages, judg.as_list())


@register_dataset("anli", files=tuple(f"anli/ANLI_analysis_r{r}_dev.csv" for r in (1, 2, 3)))
def _load_anli(ctx: _Ctx) -> Dataset:
    """Adversarial NLI dev rounds 1-3 as premise/hypothesis pairs (entailment = 1)."""
    pairs: list[LabeledPair] = []
    ids = _Ids()
    for r in (1, 2, 3):
        rel = f"anli/ANLI_analysis_r{r}_dev.csv"
        for where, row in ctx.csv(rel, ("context", "statement", "gold_label", "uid")):
            gold = row["gold_label"].strip()
            if gold not in ("e", "n", "c"):
                raise DataError(f"{where}: gold_label {gold!r} is not one of e/n/c")
            uid = ids(row["uid"].strip() or f"anli:r{r}:{_sha(row['context'] + row['statement'])}")
            premise, hypothesis = row["context"].strip(), row["statement"].strip()
            pairs.append(
                LabeledPair.named(uid, ("hypothesis", hypothesis), ("premise", premise), int(gold == "e"), group=f"r{r}")
            )
    ctx.notes["repeated_ids"] = ids.repeats
    return Dataset("anli", [], pairs=pairs)
