"""One rule for outputs (issue #41): every command that writes a folder refuses an existing one without
--overwrite (before any work), and builds into a hidden sibling renamed into place."""

from __future__ import annotations

import pytest

from ragsieve.errors import RagsieveError

#: each command that writes a folder, with the least it needs to reach the output check
WRITERS = {
    "index": ("index", "--dataset", "no-such-set", "--out"),
    "rerank train": ("rerank", "train", "--prefs", "missing.jsonl", "--out"),
    "grader train": ("grader", "train", "--pairs", "missing.jsonl", "--out"),
    "prefs build": ("prefs", "build", "--probe", "no-probe", "--out"),
    "fit": ("fit", "--index", "no-index", "--questions", "missing.jsonl", "--out"),
    "evolve init": ("evolve", "init", "--dataset", "no-such-set", "--store"),
}


@pytest.mark.parametrize("command", WRITERS)
def test_every_writer_refuses_an_existing_output_first(command, tmp_path, cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    existing = tmp_path / "out"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    result = cli(*WRITERS[command], existing)
    assert result.code == 2, result.err
    assert "out already exists" in result.err and "--overwrite" in result.err  # not the missing inputs
    assert (existing / "keep.txt").read_text() == "mine"
    assert "--overwrite" in cli(*command.split(), "--help").out


def test_evolve_init_overwrites_only_when_asked_and_leaves_no_sibling(tmp_path, cli, tiny_llm_dir):
    from ragsieve.evolve.store import EvolveStore

    store = tmp_path / "store"
    args = ("evolve", "init", "--store", store, "--dataset", "pubmedqa", "--llm", tiny_llm_dir, "--initial-size", 8,
            "--round-size", 4, "--rounds", 1, "--max-prompt-tokens", 300)
    assert cli(*args).code == 0
    assert cli(*args).code == 2
    result = cli(*args, "--overwrite", "--rounds", 2)
    assert result.code == 0, result.err
    s = EvolveStore(store)
    assert len(s.examples(2)) == 4  # the new store, not the old one
    s.close()
    assert [p.name for p in tmp_path.iterdir()] == ["store"]  # no hidden sibling left behind


def test_a_resumable_build_continues_in_its_hidden_folder_and_appears_in_one_rename(tmp_path):
    from ragsieve.atomic import partial_path, resumable_directory

    target = tmp_path / "sieve"
    with pytest.raises(KeyboardInterrupt):
        with resumable_directory(target) as work:
            (work / "phase1.json").write_text("done")
            raise KeyboardInterrupt  # killed half-way
    assert not target.exists() and (partial_path(target) / "phase1.json").is_file()

    with resumable_directory(target) as work:  # the same build again: continues
        assert (work / "phase1.json").read_text() == "done"
        (work / "phase2.json").write_text("done")
    assert sorted(p.name for p in target.iterdir()) == ["phase1.json", "phase2.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["sieve"]  # neither the work folder nor its lock is left

    with pytest.raises(RagsieveError, match="sieve already exists; pass --overwrite"):
        with resumable_directory(target):
            pass
    with resumable_directory(target, overwrite=True) as work:
        assert not any(work.iterdir())  # a fresh build, not the finished one
        with pytest.raises(RagsieveError, match="being built by another process"):
            with resumable_directory(target, overwrite=True):
                pass
        (work / "new.json").write_text("x")
    assert [p.name for p in target.iterdir()] == ["new.json"]


def test_ask_refuses_options_a_sieve_would_silently_replace(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # the help on one line per option
    result = cli("ask", "q", "--sieve", "default", "--no-retrieval", "--llm", "hf:x", "--top-k", "5")
    assert result.code == 2 and "drop --llm, --top-k (or drop --sieve)" in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert "cannot be combined with --llm, --top-k" in cli("ask", "--help").out


def test_a_missing_required_option_is_a_usage_error_not_a_traceback(cli):
    result = cli("grader", "train")
    assert result.code == 2 and "Missing option '--pairs'" in result.err
