"""bench/fit.py --ship cannot silently lose what the shipped default sieve prunes with (issue #72).

The default prunes with the keep head (`pruner: prune-head`). A refit whose grid tried it ships what the answers
chose; one whose grid never tried it must keep it (--keep-pruner) or be refused in one line, before the hour-long
fit starts.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys

import pytest

from ragsieve.pipeline.sieve_config import SieveConfig
from tests.conftest import REPO


@pytest.fixture
def fit_bench(tmp_path, monkeypatch):
    """bench/fit.py as a module, shipping into a copy of the package's default sieve under tmp_path."""
    import ragsieve.paths

    spec = importlib.util.spec_from_file_location("fit_bench_ship", REPO / "bench" / "fit.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assets = tmp_path / "assets"
    shutil.copytree(ragsieve.paths.ASSETS_DIR / "sieves" / "default", assets / "sieves" / "default",
                    ignore=shutil.ignore_patterns("probe"))
    monkeypatch.setattr(ragsieve.paths, "ASSETS_DIR", assets)
    monkeypatch.chdir(tmp_path)  # results/fit/metrics.json lands here
    return module, assets / "sieves" / "default"


def refit(tmp_path, **pruning) -> tuple:
    """A finished fit's sieve folder as `fit` writes it (top-1 of embedded:base, zero-shot pruning or none)."""
    folder = tmp_path / "fit" / "sieve"
    folder.mkdir(parents=True)
    sieve = SieveConfig(reranker="embedded:base", top_k=2, **pruning)
    (folder / "sieve.json").write_text(sieve.model_dump_json(indent=2))
    result = tmp_path / "fit.json"
    result.write_text(json.dumps({"minutes_total": 60.0, "sieve_metrics": {}}))
    return folder, result, sieve


def test_the_shipped_default_prunes_with_the_keep_head():
    shipped = json.loads((REPO / "ragsieve" / "assets" / "sieves" / "default" / "sieve.json").read_text())
    assert shipped["pruner"] == "prune-head" and shipped["prune_max_sentences"] == 1


def test_ship_refuses_in_one_line_before_the_fit_and_leaves_the_default(fit_bench, tmp_path, monkeypatch, capsys):
    module, target = fit_bench
    before = (target / "sieve.json").read_text()
    config = tmp_path / "zero-shot-only.yaml"  # a grid that never prunes with the keep head
    config.write_text("select: {prune_scorers: []}\n")
    monkeypatch.setattr(sys, "argv", ["fit.py", "--ship", "--config", str(config), "--out", str(tmp_path / "never")])
    with pytest.raises(SystemExit) as refused:
        module.main()
    message = str(refused.value.code)
    assert "\n" not in message and "'prune-head'" in message and "--keep-pruner" in message, message
    assert not (tmp_path / "never").exists()  # refused before any QA file, index or fit
    assert module.grid_scorers(str(REPO / "experiments" / "sieve_default.yaml")) == ["prune-head"]  # the default's
    folder, result, sieve = refit(tmp_path, prune_max_sentences=2, pruner="embedded:base")
    with pytest.raises(SystemExit, match="not shipped: the default sieve prunes with 'prune-head'"):
        module.ship(folder, sieve, json.loads(result.read_text()))
    assert (target / "sieve.json").read_text() == before and not (tmp_path / "results").exists()
    # a refit whose grid asked the LLM's answers of the keep head and chose otherwise ships: a measured choice
    tried = sieve.model_copy(update={"metrics": {"selection": {"grid": [{"prune_scorer": "prune-head"},
                                                                          {"prune_scorer": "zero-shot"}]}}})
    module.ship(folder, tried, json.loads(result.read_text()))
    assert SieveConfig.model_validate_json((target / "sieve.json").read_text()).pruner == "embedded:base"


def test_keep_pruner_ships_the_refit_with_the_keep_head(fit_bench, tmp_path, monkeypatch):
    module, target = fit_bench
    folder, result, _ = refit(tmp_path)
    monkeypatch.setattr(sys, "argv", ["fit.py", "--ship-finished", "--keep-pruner", "--out", str(folder.parent),
                                      "--result", str(result)])
    module.main()
    shipped = SieveConfig.model_validate_json((target / "sieve.json").read_text())
    assert (shipped.top_k, shipped.pruner, shipped.prune_max_sentences, shipped.prune_threshold) == (
        2, "prune-head", 1, None)  # the refit's choice, pruned as before
    recorded = json.loads((tmp_path / "results" / "fit" / "metrics.json").read_text())["shipped_sieve"]
    assert recorded["pruner"] == "prune-head"
