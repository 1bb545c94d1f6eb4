"""Tests for ragsieve.data: JSON-lines I/O, splits, and the benchmark loaders."""

from __future__ import annotations

import gzip
import random
from collections import Counter
from pathlib import Path

import pytest

from ragsieve.data import (
    DATASET_LICENCES,
    Dataset,
    SplitError,
    append_jsonl,
    available_datasets,
    dataset_licence,
    default_data_dir,
    load_dataset,
    read_jsonl,
    split_by_id,
    stratified_split_by_id,
    write_jsonl,
)
from ragsieve.errors import DataError, RagsieveError
from tests.conftest import SHARED_DATA

SHARED = SHARED_DATA  # ../shared/data or $RAGSIEVE_DATA, as the loaders read it
needs_data = pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared data dir {SHARED} absent")

# --------------------------------------------------------------------------- jsonl


def test_malformed_line_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2\n{"a": 3}\n')
    with pytest.raises(DataError, match=r"rows\.jsonl:3: malformed JSON line \(") as exc:
        list(read_jsonl(path))
    assert "\n" not in str(exc.value)


def test_non_object_line_is_malformed(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"rows\.jsonl:2: .*expected an object, got list"):
        list(read_jsonl(path))


def test_skip_bad_counts_and_blank_lines_ignored(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"a": 1}\n\n   \nnot json\n"str"\n\xff\xfe\n{"a": 2}\n{"a": 3}')  # no final newline
    reader = read_jsonl(path, skip_bad=True)
    assert [r["a"] for r in reader] == [1, 2, 3]
    assert reader.skipped == 3


def test_gzip_reading(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write('{"q": "é"}\n\n{"q": "b"}\n')
    assert [r["q"] for r in read_jsonl(path)] == ["é", "b"]


def test_truncated_gzip(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"a": 1}\n' * 200)[:-20])
    with pytest.raises(DataError, match=r"rows\.jsonl\.gz: corrupt or truncated gzip"):
        list(read_jsonl(path, skip_bad=True))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="nope.jsonl: file not found"):
        list(read_jsonl(tmp_path / "nope.jsonl"))


def test_write_is_atomic_and_roundtrips(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "out.jsonl"
    assert write_jsonl(path, [{"a": 1}, {"b": "ü"}]) == 2
    assert list(read_jsonl(path)) == [{"a": 1}, {"b": "ü"}]

    def failing():
        yield {"a": 9}
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_jsonl(path, failing())
    assert list(read_jsonl(path)) == [{"a": 1}, {"b": "ü"}]  # old content intact
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.jsonl"]  # no temp left

    gz = tmp_path / "out.jsonl.gz"
    write_jsonl(gz, [{"x": 1}])
    assert list(read_jsonl(gz)) == [{"x": 1}]


def test_append_recovers_from_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "store.jsonl"
    append_jsonl(path, {"i": 1})
    with open(path, "ab") as fh:
        fh.write(b'{"i": 2, "trunc')  # a crash mid-write
    append_jsonl(path, {"i": 3})
    reader = read_jsonl(path, skip_bad=True)
    assert [r["i"] for r in reader] == [1, 3]
    assert reader.skipped == 1


# --------------------------------------------------------------------------- splits


def test_split_deterministic_and_order_independent() -> None:
    ids = [f"q{i}" for i in range(2000)]
    a = split_by_id(ids, seed=3)
    shuffled = ids[:]
    random.Random(0).shuffle(shuffled)
    assert split_by_id(shuffled, seed=3) == a
    assert split_by_id(ids, seed=4) != a
    assert sorted(a["train"] + a["test"]) == sorted(ids)
    assert 0.75 < len(a["train"]) / len(ids) < 0.85
    # adding ids never moves existing ones
    b = split_by_id(ids + ["extra1", "extra2"], seed=3)
    assert set(a["test"]) <= set(b["test"])


def test_split_fraction_validation() -> None:
    with pytest.raises(SplitError, match="sum to 1"):
        split_by_id(["a"], {"train": 0.7, "test": 0.2})
    with pytest.raises(RagsieveError, match="must be a number in"):
        split_by_id(["a"], {"train": 1.5, "test": -0.5})
    with pytest.raises(ValueError):
        stratified_split_by_id(["a"], ["x"], {})
    three = split_by_id([str(i) for i in range(300)], {"a": 0.5, "b": 0.3, "c": 0.2})
    assert sum(map(len, three.values())) == 300


def test_stratified_split_keeps_proportions() -> None:
    ids = [f"id{i}" for i in range(1000)]
    labels = {i: ("pos" if n % 4 == 0 else "neg") for n, i in enumerate(ids)}
    out = stratified_split_by_id(ids, labels, {"train": 0.8, "test": 0.2}, seed=1)
    test_labels = Counter(labels[i] for i in out["test"])
    assert test_labels == {"pos": 50, "neg": 150}
    rev = list(reversed(ids))
    assert stratified_split_by_id(rev, [labels[i] for i in rev], {"train": 0.8, "test": 0.2}, seed=1) == out
    with pytest.raises(SplitError, match="two labels"):
        stratified_split_by_id(["a", "a"], [0, 1])
    with pytest.raises(SplitError, match="2 ids but 1 labels"):
        stratified_split_by_id(["a", "b"], [0])


# --------------------------------------------------------------------------- registry / data dir


def test_unknown_dataset() -> None:
    with pytest.raises(DataError, match=r"unknown dataset 'x'; available: .*nq-open"):
        load_dataset("x", data_dir=SHARED)


def test_registry_and_licences() -> None:
    names = available_datasets()
    assert set(names) == {
        "nq-open", "nq-oracle", "hotpotqa", "hotpotqa-distractor", "fever",
        "multirc", "pubmedqa", "bioasq", "anli",
    }
    assert set(DATASET_LICENCES) == set(names)
    assert "NC" in dataset_licence("anli")


def test_missing_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "no-such-dir"
    monkeypatch.setenv("RAGSIEVE_DATA", str(missing))
    with pytest.raises(DataError, match="set RAGSIEVE_DATA or pass --data-dir") as exc:
        default_data_dir()
    assert str(missing) in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(DataError, match="no-such-dir"):
        load_dataset("nq-open")


def test_missing_file_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGSIEVE_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    with pytest.raises(DataError, match=r"NQ-open\.dev\.jsonl not found"):
        load_dataset("nq-open")


def test_loader_reports_file_line_and_skips(tmp_path: Path) -> None:
    (tmp_path / "nq").mkdir()
    (tmp_path / "nq" / "NQ-open.dev.jsonl").write_text(
        '{"question": "q1", "answer": ["a"]}\n{oops\n{"question": "q2", "answer": ["b"]}\n'
    )
    with pytest.raises(DataError, match=r"NQ-open\.dev\.jsonl:2: malformed JSON line"):
        load_dataset("nq-open", data_dir=tmp_path)
    ds = load_dataset("nq-open", data_dir=tmp_path, skip_bad=True)
    assert [q.text for q in ds.questions] == ["q1", "q2"] and ds.skipped_lines == 1
    (tmp_path / "nq" / "NQ-open.dev.jsonl").write_text('{"question": "q1"}\n')
    with pytest.raises(DataError, match=r"NQ-open\.dev\.jsonl:1: missing field 'answer'"):
        load_dataset("nq-open", data_dir=tmp_path)


# --------------------------------------------------------------------------- real datasets

_CACHE: dict[str, Dataset] = {}


def _load(name: str) -> Dataset:
    if name not in _CACHE:
        _CACHE[name] = load_dataset(name, data_dir=SHARED)
    return _CACHE[name]


def _check_common(ds: Dataset) -> None:
    ids = [q.id for q in ds.questions]
    assert len(ids) == len(set(ids))
    pids = [p.id for p in ds.passages]
    assert len(pids) == len(set(pids))
    assert len({(p.title, p.text) for p in ds.passages}) == len(ds.passages)
    pair_ids = [p.id for p in ds.pairs]
    assert len(pair_ids) == len(set(pair_ids))
    pool = set(pids)
    assert all(j.passage_id in pool for j in ds.judgments)
    assert all(g in pool for q in ds.questions for g in q.gold_passage_ids)
    qids = set(ids)
    assert all(j.query_id in qids for j in ds.judgments)
    assert all(p.label in (0, 1) for p in ds.pairs)
    assert ds.meta["licence"] == dataset_licence(ds.name)


@needs_data
@pytest.mark.parametrize("name", ["nq-open", "nq-oracle", "hotpotqa", "hotpotqa-distractor", "fever",
                                  "multirc", "pubmedqa", "bioasq", "anli"])
def test_real_dataset_loads(name: str) -> None:
    ds = _load(name)
    assert ds.name == name
    assert ds.questions or ds.pairs
    _check_common(ds)


@needs_data
def test_ids_are_stable_across_loads() -> None:
    again = load_dataset("nq-oracle", data_dir=SHARED)
    first = _load("nq-oracle")
    assert [q.id for q in again.questions] == [q.id for q in first.questions]
    assert [p.id for p in again.passages] == [p.id for p in first.passages]


@needs_data
def test_nq_shapes() -> None:
    nq = _load("nq-open")
    assert len(nq.questions) == 3610 and not nq.passages
    assert all(q.answers for q in nq.questions)
    oracle = _load("nq-oracle")
    assert len(oracle.questions) == 2655
    pool = oracle.passage_by_id()
    assert all(len(q.gold_passage_ids) == 1 and q.gold_passage_ids[0] in pool for q in oracle.questions)
    assert len(oracle.passages) < 2655  # some questions share a gold passage
    assert {q.id for q in oracle.questions} <= {q.id for q in nq.questions}  # same question, same id


@needs_data
def test_hotpotqa_shapes() -> None:
    hp = _load("hotpotqa")
    assert len(hp.questions) == 7405 and all(len(q.answers) == 1 for q in hp.questions)
    assert {q.meta["type"] for q in hp.questions} == {"bridge", "comparison"}
    ds = _load("hotpotqa-distractor")
    assert len(ds.questions) == 100
    qrels = ds.qrels()
    for q in ds.questions:
        cands = q.meta["candidate_ids"]
        assert len(cands) == 10 and len(set(cands)) == 10
        assert q.gold_passage_ids and set(q.gold_passage_ids) <= set(cands)
        assert set(qrels[q.id]) == set(q.gold_passage_ids)
    judged = Counter(j.query_id for j in ds.judgments)
    assert set(judged.values()) == {10}
    assert sum(p.label for p in ds.pairs) == 249  # one per supporting fact
    assert set(ds.pairs[0].fields) == {"question", "sentence"}


@needs_data
def test_fever_shapes() -> None:
    ds = _load("fever")
    assert len(ds.questions) == 6122 and len(ds.pairs) == 6122
    assert Counter(q.answers[0] for q in ds.questions) == {"REFUTES": 3103, "SUPPORTS": 3019}
    assert all(q.gold_passage_ids for q in ds.questions)
    assert Counter(p.label for p in ds.pairs) == {1: 3019, 0: 3103}
    p = ds.passage_by_id()["Steve_Wozniak:3"]
    assert p.title == "Steve Wozniak" and p.text.startswith("He primarily designed")
    assert set(ds.pairs[0].fields) == {"claim", "evidence"}


@needs_data
def test_multirc_shapes() -> None:
    ds = _load("multirc")
    assert Counter(p.group for p in ds.pairs) == {"train": 27243, "val": 4848}
    assert len(ds.questions) == 5131 + 953 and len(ds.passages) == 456 + 83
    assert set(ds.pairs[0].fields) == {"passage", "question", "answer"}
    q = ds.questions[0]
    assert q.answers and all(a in {p.fields["answer"] for p in ds.pairs if p.query_id == q.id} for a in q.answers)


@needs_data
def test_pubmedqa_shapes() -> None:
    ds = _load("pubmedqa")
    assert len(ds.questions) == 1000
    assert len(ds.pairs) == 1000 - 110  # maybe dropped
    assert Counter(p.group for p in ds.pairs) == {"test": 445, "train": 445}
    assert all(p.fields["context"] for p in ds.pairs)
    assert all(q.gold_passage_ids for q in ds.questions)
    assert ds.passage_by_id()[ds.questions[0].gold_passage_ids[0]].title  # section label as title


@needs_data
def test_bioasq_shapes() -> None:
    ds = _load("bioasq")
    assert len(ds.questions) == 2310
    assert all(len(q.id) == 24 for q in ds.questions)  # upstream ids
    assert ds.questions[0].meta["batch"] == "7B1"
    assert {q.meta["batch"][:-2] for q in ds.questions} == {"7", "8", "9", "10", "11"}
    assert all(q.gold_passage_ids for q in ds.questions)
    yesno = [q for q in ds.questions if q.meta["type"] == "yesno"]
    assert yesno and all(q.answers[0] in ("yes", "no") for q in yesno)
    assert ds.meta["repeated_questions_dropped"] == 0


@needs_data
def test_anli_shapes() -> None:
    ds = _load("anli")
    assert len(ds.pairs) == 3198 and ds.questions == []
    assert Counter(p.group for p in ds.pairs) == {"r1": 1000, "r2": 1000, "r3": 1198}
    assert sum(p.label for p in ds.pairs) == 334 + 334 + 402
    p = ds.pairs[0]
    assert set(p.fields) == {"premise", "hypothesis"} and p.query == p.fields["hypothesis"]


def test_stripped_rows_join_their_text_back_by_id_and_refuse_other_text(tmp_path):
    """Committed rows keep ids; the text comes back from the dataset, and a different text is refused."""
    from ragsieve.data.stripped import DIGEST_FIELD, TextField, join_text, strip_text

    data = tmp_path / "data"
    (data / "nq").mkdir(parents=True)
    with gzip.open(data / "nq" / "nq-open-oracle.jsonl.gz", "wt") as fh:
        fh.write('{"question": "who wrote hamlet", "answers": ["Shakespeare"], '
                 '"ctxs": [{"title": "Hamlet", "text": "Hamlet is by William Shakespeare.", "isgold": true}]}\n')
    from ragsieve.data import load_dataset

    ds = load_dataset("nq-oracle", data_dir=data)
    q, p = ds.questions[0], ds.passages[0]
    fields = (TextField("query", "query_id", "question"), TextField("pos", "pos_ids", "passage"))
    row = {"dataset": "nq-oracle", "query_id": q.id, "query": q.text, "pos_ids": [p.id], "pos": [p.full_text],
           "pos_scores": [0.4]}
    stripped = strip_text([row], fields)[0]
    assert set(stripped) == {"dataset", "query_id", "pos_ids", "pos_scores", DIGEST_FIELD}
    assert join_text([stripped], fields, data_dir=data) == [row]
    assert join_text([row], fields, data_dir=data) == [row]  # rows with their text pass through
    with pytest.raises(DataError, match="differs from the text the results were made with"):
        join_text([{**stripped, DIGEST_FIELD: "000000000000"}], fields, data_dir=data, where="prefs.jsonl")
    with pytest.raises(DataError, match="nq-oracle has no passage 'wiki:gone'"):
        join_text([{**stripped, "pos_ids": ["wiki:gone"]}], fields, data_dir=data)
