"""What a clone of the repository may hold: no third-party dataset text in the committed results, and no
large file (weights, caches) outside the shipped assets.

Benchmark questions and passages (NQ, HotpotQA, BioASQ: research use only, ...) are joined back from
RAGSIEVE_DATA by id when a study needs them (:mod:`ragsieve.data.stripped`); training outputs stay in
git-ignored work folders with their sha256 in the study's ``artifacts.json``.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

LONG_WORDS = 8  # a string of this many words or more is prose: ours, the LLM's, or a dataset's
MAX_BYTES = 5 * 1024 * 1024
ASSETS = "ragsieve/assets/"
SCANNED = ("results/",)  # bench/results/ holds timings and our notes, no benchmark rows

# Keys whose values are ids, even when an id is a title of several words (HotpotQA's passages).
ID_KEYS = ("id",)
# The LLM's own output: allowed while short (a 16–64 token answer), never a copied document.
LLM_OUTPUT_KEYS = {"generation", "prediction"}
LLM_OUTPUT_MAX_WORDS = 60
# Keys of our own prose in result JSON (notes on a measurement, a rule, a split's description).
OWN_PROSE_KEYS = {"note", "llm_share_note", "why", "int8_why", "rule", "split", "protocol", "synthetic_method",
                  "intervals", "skipped", "chance", "metric", "reason", "verdict", "estimated_on", "from",
                  "best_plain_from"}
# metric: what a guard measured; skipped: why fit skipped a stage (an endpoint has no probe) or
# a round was skipped; chance: what the labeller check took as chance; int8_why: a student's int8 verdict (ragsieve's
# own words); reason / verdict: fit's and the statistics' decisions in a line; estimated_on / from / best_plain_from:
# which questions an estimate or a choice came from
# A configuration of fit's grid, by name ("top2, reranker, grade f1, best last, gate q0.75"): ragsieve's own words
FIT_CONFIGURATION = re.compile(r"^(closed book|top\d+(, [\w:./-]+( [\w:./-]+)*)*)$")
# Keys that hold dataset text in the formats ragsieve writes: any non-empty string there is text.
TEXT_KEYS = {"query", "question", "passage", "passages", "pos", "neg", "context", "premise", "hypothesis", "claim",
             "document", "text", "title", "answers_gold"}


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [f for f in out.decode().split("\0") if f and (REPO / f).is_file()]


def _is_id_key(key: str) -> bool:
    return key in ID_KEYS or key.endswith(("_id", "_ids"))


def text_problems(value, where: str, key: str = "", parent: str = "") -> list[str]:
    """Places in a parsed JSON value that hold dataset text (``where`` names the file and line)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in text_problems(v, where, str(k), key)]
    if isinstance(value, list):
        return [p for v in value for p in text_problems(v, where, key, parent)]
    if not isinstance(value, str):
        return []
    words = len(value.split())
    if key in TEXT_KEYS and words:
        return [f"{where}: '{key}' holds text: {value[:80]!r}"]
    if words < LONG_WORDS or _is_id_key(key) or key in OWN_PROSE_KEYS or FIT_CONFIGURATION.match(value):
        return []
    # an LLM's answers keyed by question id ({"answers": {qid: answer}}), or a generation field
    if key in LLM_OUTPUT_KEYS or parent == "answers":
        if words <= LLM_OUTPUT_MAX_WORDS:
            return []
        return [f"{where}: '{key}' is {words} words, too long for the LLM's own answer"]
    return [f"{where}: '{key}' holds {words} words of text: {value[:80]!r}"]


def file_problems(path: Path, name: str) -> list[str]:
    if name.endswith((".jsonl", ".jsonl.gz")):  # .jsonl.gz: a study's committed score records
        import gzip

        raw = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
        problems = []
        for lineno, line in enumerate(raw.decode("utf-8").splitlines(), 1):
            if line.strip():
                problems += text_problems(json.loads(line), f"{name}:{lineno}")
        return problems
    return text_problems(json.loads(path.read_text(encoding="utf-8")), name)


def test_no_dataset_text_in_committed_results():
    problems = []
    for name in tracked_files():
        if name.startswith(SCANNED) and name.endswith((".json", ".jsonl", ".jsonl.gz")):
            problems += file_problems(REPO / name, name)
    assert not problems, f"{len(problems)} place(s) hold dataset text:\n" + "\n".join(problems[:20])


def test_no_large_file_outside_assets():
    large = [f"{name} ({(REPO / name).stat().st_size / 2**20:.1f} MB)" for name in tracked_files()
             if not name.startswith(ASSETS) and (REPO / name).stat().st_size > MAX_BYTES]
    assert not large, "tracked files over 5 MB outside ragsieve/assets/ (keep them in a git-ignored work folder):\n" \
        + "\n".join(large)


def test_the_scan_finds_text_it_must_and_passes_what_it_may():
    """The rules themselves, on rows shaped like the ones that used to be committed."""
    passage = "Nathan Hale: Nathan Hale was an American soldier and spy for the Continental Army during the war."
    assert text_problems({"query": "who was executed", "pos": [passage]}, "prefs")  # any question text
    assert text_problems({"query_id": "q1", "note_text": passage}, "x")  # long text under another key
    assert text_problems({"generation": " ".join(["word"] * 200)}, "gens")  # a copied document, not an answer
    assert not text_problems({"query_id": "nq:1", "pos_ids": ["wiki:1"], "pos_scores": [0.3], "label": 1}, "stripped")
    assert not text_problems({"context_ids": ["On the Knocking at the Gate in Macbeth is a title"]}, "ids")
    assert not text_problems({"answers": {"5a8b": "The Sandy and Beaver Canal in Ohio was longer than it"}}, "cell")
    assert not text_problems({"generation": "Admiral Thomas Fletcher was executed for being a spy in 1776"}, "g")


def test_training_outputs_are_recorded_by_sha256_and_a_rebuild_is_checked(tmp_path):
    import hashlib

    from ragsieve.artifacts import record_training_outputs

    out = tmp_path / "study"
    weights = out / "work" / "m0" / "adapter_model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"weights")
    assert "recorded in" in record_training_outputs(out, [weights])[0]
    record = json.loads((out / "artifacts.json").read_text())
    assert record == {"work/m0/adapter_model.safetensors": {"sha256": hashlib.sha256(b"weights").hexdigest(), "bytes": 7}}
    assert "rebuilt the recorded file" in record_training_outputs(out, [weights])[0]
    weights.write_bytes(b"other weights")
    assert "differs from the recorded file" in record_training_outputs(out, [weights])[0]
