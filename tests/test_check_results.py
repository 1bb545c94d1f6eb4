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


def _quoted_files() -> tuple[dict[str, str], dict]:
    checker = _checker()
    files = {name: (REPO / name).read_text(encoding="utf-8") for name in checker.PROSE_FILES}
    return files, yaml.safe_load((REPO / "tools" / "prose_sources.yaml").read_text(encoding="utf-8")) or {}


def test_readme_and_assets_readme_quote_only_what_their_sources_hold():
    files, stated = _quoted_files()
    assert _checker().check_quoted(files, stated) == []


def test_a_number_quoted_outside_the_results_table_that_its_folder_does_not_hold_fails():
    """The assets README quoted the grader's intervals of an older run ([0.724, 0.823]); its row cites
    results/grader_scale/, whose metrics.json holds [0.713, 0.843] (0.823 happens to be another value there)."""
    checker = _checker()
    files, stated = _quoted_files()
    assets = files["ragsieve/assets/README.md"]
    assert "P 0.776 [0.713, 0.843]" in assets
    files["ragsieve/assets/README.md"] = assets.replace("P 0.776 [0.713, 0.843]", "P 0.776 [0.724, 0.823]", 1)
    problems = checker.check_quoted(files, stated)
    assert len(problems) == 1 and "0.724 is in none of results/grader_scale/" in problems[0], problems


def test_a_figure_attributed_to_a_json_file_that_does_not_hold_it_fails():
    checker = _checker()
    files, stated = _quoted_files()
    readme = files["README.md"]
    planted = ("\nA single process served 26.3 pairs/s (`bench/results/serve.json`). The shipped default scored "
               "65.3 pairs/s there too (`bench/results/serve.json`).\n\n## Model specs")
    files["README.md"] = readme.replace("\n## Model specs", planted, 1)
    problems = checker.check_quoted(files, stated)
    assert len(problems) == 1 and "26.3 is in none of bench/results/serve.json" in problems[0], problems
    files["README.md"] = readme.replace("\n## Model specs", "\nSee `bench/results/nope.json`.\n\n## Model specs", 1)
    assert any("`bench/results/nope.json` does not exist" in p for p in checker.check_quoted(files, stated))


def test_a_count_that_disagrees_with_its_list_fails():
    checker = _checker()
    inline = "It answers 50 questions three ways: closed-book, with the top-3 passages, through the sieve and without it.\n"
    assert checker.check_counts(inline, "x.md") == ['x.md:1: "three ways:" announces 3 and lists 4']
    assert checker.check_counts(inline.replace("three", "four"), "x.md") == []
    bullets = "Two consequences worth knowing:\n\n- **One.** a,\n  b.\n- **Two.** c (d, e).\n- **Three.** f.\n\nNext.\n"
    assert checker.check_counts(bullets, "x.md") == ['x.md:1: "Two consequences worth knowing:" announces 2 and lists 3']
    files, stated = _quoted_files()
    assert "Three\nconsequences worth knowing:" in files["README.md"]
    files["README.md"] = files["README.md"].replace("Three\nconsequences worth knowing:", "Two\nconsequences worth knowing:")
    assert [p for p in checker.check_quoted(files, stated) if "announces 2 and lists 3" in p]


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
