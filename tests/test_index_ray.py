"""`ragsieve index --ray local`: encoding on a real local Ray instance builds the index one process builds, resumes
after `kill -9` from its finished shards, and `--add` works the same way (issue #74)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ragsieve.data.records import Passage
from ragsieve.models.encoder import INDEX_MIN_COSINE
from ragsieve.retrieve import add_to_index, build_index, load_index

pytest.importorskip("ray", reason="the ray extra is part of the dev install")

REPO = Path(__file__).resolve().parents[1]
TOPICS = ["penicillin", "the Himalayas", "Hamlet", "photosynthesis", "the euro", "Jupiter", "the Nile", "mitochondria",
          "Westphalia", "the printing press", "volcanoes", "the Roman Senate"]
SHARD = 8


def corpus(n: int, start: int = 0) -> list[Passage]:
    """Distinct passages of varied length (so shards pad to different widths)."""
    return [Passage(f"d{i}", f"Note {i} on {TOPICS[i % len(TOPICS)]}: " + " ".join(
        f"{TOPICS[(i * j) % len(TOPICS)]} fact {j}." for j in range(1 + i % 9)), f"Doc {i}")
            for i in range(start, start + n)]


def write_jsonl(path: Path, passages: list[Passage]) -> Path:
    path.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n" for p in passages))
    return path


def ragsieve(*args, env: dict, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ragsieve.cli", *map(str, args)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **popen)


def shard_files(work: Path) -> list[Path]:
    return sorted(work.glob("*.npz"))


def assert_same_index(a: Path, b: Path) -> None:
    ra, rb = load_index(a), load_index(b)
    assert [p.id for p in ra.passages] == [p.id for p in rb.passages]
    assert ra.encoder_backend == rb.encoder_backend
    cosines = (ra.embeddings * rb.embeddings).sum(1)
    assert cosines.min() >= INDEX_MIN_COSINE, cosines.min()


def test_index_on_ray_matches_one_process_resumes_after_kill_and_adds(tmp_path):
    from ragsieve.retrieve.scale import ray_work_dir

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    passages = corpus(240)
    source = write_jsonl(tmp_path / "corpus.jsonl", passages)
    # one process first (it also makes the encoder's ONNX export, which the actors then load)
    one = build_index(passages, tmp_path / "one-process", kind="dense", show_progress=False)
    work = ray_work_dir([p.full_text for p in passages], one.encoder_spec, one.encoder_backend)
    args = ["index", "--passages", source, "--out", tmp_path / "on-ray", "--kind", "dense", "--chunk-tokens", "0",
            "--ray", "local", "--shard-size", SHARD]
    total = len(passages) // SHARD

    first = ragsieve(*args, env=env)
    deadline = time.monotonic() + 300
    while not shard_files(work) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.killpg(first.pid, signal.SIGKILL)  # the driver and the Ray instance it started
    first.wait(30)
    kept = len(shard_files(work))
    assert 0 < kept < total, (kept, first.stderr.read()[-2000:])
    assert not (tmp_path / "on-ray").exists()  # no half-written index

    second = ragsieve(*args, env=env)
    out, err = second.communicate(timeout=600)
    assert second.returncode == 0, err[-3000:]
    resumed = [line for line in err.splitlines() if "shards already encoded" in line]
    assert resumed and int(resumed[0].split()[0]) >= kept, err[-3000:]
    assert "on Ray local" in " ".join(err.split())  # the phase line (wrapped to the console's width)
    assert not shard_files(work)  # the finished job's shards are gone
    # HNSW vs HNSW over the same vectors: compare the vectors and ids, not the graph
    assert_same_index(tmp_path / "one-process", tmp_path / "on-ray")

    more = corpus(30, start=240)
    add_to_index(tmp_path / "one-process", more)
    added = ragsieve("index", "--add", "--passages", write_jsonl(tmp_path / "more.jsonl", more), "--out",
                     tmp_path / "on-ray", "--chunk-tokens", "0", "--ray", "local", "--shard-size", SHARD, env=env)
    out, err = added.communicate(timeout=600)
    assert added.returncode == 0, err[-3000:]
    assert_same_index(tmp_path / "one-process", tmp_path / "on-ray")
    assert np.asarray(load_index(tmp_path / "on-ray").embeddings).shape[0] == 270
