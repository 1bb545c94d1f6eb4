"""`make check-docs` (tools/check_docs.py): it catches what it claims to, and the README passes its cheap part."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _checker():
    spec = importlib.util.spec_from_file_location("check_docs", REPO / "tools" / "check_docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


BAD = '''# demo

```bash
ragsieve index --passages docs/ --out index/x --kind bm25 --chunk-tokens 50
.venv/bin/ragsieve ask "q" --index index/x --no-such-flag 3   # a flag ask does not have
ragsieve rerank "who wrote hamlet" --passages cands.jsonl -r bm25 --bogus
ragsieve frobnicate --now
make no-such-target
python bench/nope.py
ragsieve run experiments/missing.yaml
```

```python
from ragsieve import Sieve
from ragsieve.pipeline import NoSuchThing
```

See `ragsieve.rerank.calibration.threshold_for_precision` and `ragsieve.rerank.calibration.nothing_here`;
`ragsieve grader train --kindd head` is inline.
'''


def test_the_checker_reports_flags_commands_imports_and_names(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(BAD)
    assert _checker().main(["--readme", str(readme), "--no-run"]) == 1
    err = capsys.readouterr().err
    for problem in ("`ragsieve ask` has no --no-such-flag", "`ragsieve rerank` has no --bogus",
                    "frobnicate --now`: not a ragsieve command", "no target 'no-such-target'",
                    "bench/nope.py does not exist", "experiments/missing.yaml does not exist",
                    "NoSuchThing", "`ragsieve.rerank.calibration.nothing_here` does not exist",
                    "`ragsieve grader train` has no --kindd"):
        assert problem in err, (problem, err)
    assert "--chunk-tokens" not in err and "Sieve`" not in err and "threshold_for_precision" not in err
    assert len(err.strip().splitlines()) == 9


def test_the_readme_flags_and_imports_match_the_code(capsys):
    assert _checker().main(["--no-run"]) == 0, capsys.readouterr().err


def test_cheap_commands_run_in_a_scratch_folder(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("```bash\nragsieve index --passages docs/ --out index/mine --kind bm25\n"
                      "ragsieve retrieve \"who wrote hamlet\" --index index/nq -k 2\n"
                      "ragsieve retrieve \"who wrote hamlet\" --index index/missing\n```\n")
    assert _checker().main(["--readme", str(readme), "--list"]) == 1
    captured = capsys.readouterr()
    assert "3 command(s) run" in captured.out and "index/missing" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


QUICKSTART = '''# demo

<!-- check-docs: runs, and prints the text block after it -->
```python
from ragsieve.eval.qa import normalize_answer
print(normalize_answer("The  Hamlet!"))
```

```text
PRINTED
```
'''


def test_the_quickstart_runs_and_must_print_what_the_readme_shows(tmp_path, capsys):
    from ragsieve.eval.qa import normalize_answer

    readme = tmp_path / "README.md"
    readme.write_text(QUICKSTART.replace("PRINTED", normalize_answer("The  Hamlet!")))
    assert _checker().main(["--readme", str(readme), "--list"]) == 0, capsys.readouterr().err
    assert "python snippet" in capsys.readouterr().out
    readme.write_text(QUICKSTART.replace("PRINTED", "hamlet, 15 -> 6 tokens"))  # output that drifted
    assert _checker().main(["--readme", str(readme)]) == 1
    assert "the snippet prints 'hamlet', the README shows 'hamlet, 15 -> 6 tokens'" in capsys.readouterr().err
    readme.write_text(QUICKSTART.replace("normalize_answer(", "no_such_function("))
    assert _checker().main(["--readme", str(readme)]) == 1
    assert "the snippet fails: NameError" in capsys.readouterr().err


def test_the_readme_quickstart_is_checked():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    (line, code, printed), = _checker().runnable_snippets(readme)
    assert 'Sieve.load("embedded:default")' in code and "tokens)" in printed and line < 60  # on the first screen


def test_the_architecture_diagram_is_the_layers_contract():
    checker = _checker()
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    assert checker.check_architecture(readme, pyproject) == []
    dropped = readme.replace("grade | prune\n", "grade\n", 1)
    assert "missing: prune" in checker.check_architecture(dropped, pyproject)[0]
    swapped = readme.replace("probe\nretrieve | prompts\n", "retrieve | prompts\nprobe\n", 1)
    assert "order or grouping" in checker.check_architecture(swapped, pyproject)[0]
