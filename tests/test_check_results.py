"""`make check-results` (tools/check_results.py): README.md's Results section against the committed JSON."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def _checker():
    spec = importlib.util.spec_from_file_location("check_results", REPO / "tools" / "check_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_results_number_is_backed_and_a_changed_one_is_caught():
    checker = _checker()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    sources = yaml.safe_load((REPO / "tools" / "results_sources.yaml").read_text(encoding="utf-8"))
    assert checker.check(readme, sources) == []
    # a number that no run produced, and a verdict's number moved: both fail, naming the row
    section = checker.results_section(readme)
    probe_row = next(text for key, text in checker.rows(section) if key.startswith("knowledge-boundary probe, 3,610"))
    assert "0.730 [0.700, 0.762]" in probe_row
    problems = checker.check(readme.replace("0.730 [0.700, 0.762]", "0.731 [0.700, 0.762]", 1), sources)
    assert len(problems) == 1 and "0.731" in problems[0] and "knowledge-boundary probe" in problems[0]
    # an undeclared row fails too
    extra = readme.replace("| demo: 50 held-out", "| a new study with 7 numbers |  8 | x |\n| demo: 50 held-out", 1)
    assert any("not declared" in p for p in checker.check(extra, sources))


def test_numbers_skip_names_and_read_signs():
    checker = _checker()
    text = "SmolLM2 P@3 top-3 `results/x1.json` M_4: −0.014 [−0.048, +0.018], 3,610 questions, 22.0 %, p < 1e-5"
    assert list(checker.numbers(text)) == ["−0.014", "−0.048", "+0.018", "3,610", "22.0"]
    assert checker.backed("−0.014", [-0.01412]) and checker.backed("22.0", [0.22])
    assert not checker.backed("0.731", [0.7297])


def test_a_margin_verdict_is_re_derived_from_the_committed_outcomes():
    """Issue #70: "as good as" only at a stated margin; a row that calls the shipped default non-inferior where
    its per-question outcomes leave the interval below −δ fails, naming what the outcomes give."""
    checker = _checker()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    sources = yaml.safe_load((REPO / "tools" / "results_sources.yaml").read_text(encoding="utf-8"))
    planted = readme.replace("+3.0 pp): undecided at δ = 2 pp", "+3.0 pp): non-inferior at δ = 2 pp", 1)
    assert planted != readme
    problems = checker.check(planted, sources)
    assert len(problems) == 1 and "gives 'undecided at δ = 2 pp'" in problems[0]
