"""What `pip install` ships: the library, not the studies; and `ragsieve run` outside a checkout says so."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_run_outside_a_checkout_is_one_line_and_writes_nothing(tmp_path):
    """An installed ragsieve has no studies: `ragsieve run` on a study config, in a folder with no `studies/`
    package around it, fails in one line (the real command in a real process, on a real config)."""
    config = tmp_path / "cascade.yaml"
    shutil.copy(REPO / "experiments" / "cascade.yaml", config)
    # ragsieve from the checkout under test; the config and the working folder are outside it
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "ragsieve.cli", "run", config.name], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("error: cascade.yaml: studies run from a source checkout"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cascade.yaml"]  # refused before anything is written


def test_a_checkouts_study_config_runs_from_any_folder(tmp_path):
    """`ragsieve run /path/to/checkout/experiments/x.yaml` from elsewhere loads that checkout's studies (here up to
    cascade's answer that it has no report mode: the study registry was found and read)."""
    proc = subprocess.run([sys.executable, "-m", "ragsieve.cli", "run", str(REPO / "experiments" / "cascade.yaml"),
                           "--report-only"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == "error: experiment 'cascade' has no report-only mode; run it without --report-only"


def test_a_study_config_finds_the_checkout_it_belongs_to(tmp_path):
    """The config's own checkout first (run from anywhere), else the working folder's; None outside any."""
    from ragsieve.cli.studies import checkout_root

    assert checkout_root(REPO / "experiments" / "cascade.yaml", cwd=tmp_path) == REPO
    assert checkout_root(tmp_path / "x.yaml", cwd=REPO / "experiments") == REPO
    assert checkout_root(tmp_path / "x.yaml", cwd=tmp_path) is None


def test_the_wheel_ships_the_library_without_the_studies(tmp_path):
    """`pip wheel .` of the checkout (setuptools from this environment: no download) holds ragsieve and the CLI's
    study loader, and no `studies/` package, top-level or inside ragsieve."""
    src = tmp_path / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist")
    src.mkdir()
    for top in REPO.iterdir():  # the checkout as cloned, less the committed results (big, and no package)
        if top.name in {".git", ".venv", "results", "build", "dist"} or top.name.endswith(".egg-info"):
            continue
        if top.is_dir():
            shutil.copytree(top, src / top.name, ignore=skip)
        else:
            shutil.copy(top, src / top.name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q",
                           "--disable-pip-version-check", "-w", str(tmp_path / "dist")], cwd=src,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("ragsieve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith(("studies/", "ragsieve/studies/"))]
    assert {"ragsieve/cli/studies.py", "ragsieve/pipeline/demo.py", "ragsieve/retrieve/evaluation.py"} <= set(names)
    assert {n.split("/")[0] for n in names} == {"ragsieve", wheel.name.split("-py3")[0] + ".dist-info"}


def test_make_refuses_a_wrong_python_in_one_line_before_creating_the_venv(tmp_path):
    """The Makefile's NEEDED_PYTHON is pyproject's requires-python; a Python of another version (here: the
    real interpreter against a Makefile told to need another one) or none at all is one line, exit non-zero,
    and no .venv."""
    import re
    import tomllib

    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    needed = re.search(r"^NEEDED_PYTHON \?= (\S+)$", (REPO / "Makefile").read_text(), flags=re.M).group(1)
    assert requires == f">={needed},<3.{int(needed.split('.')[1]) + 1}", (requires, needed)
    venv = tmp_path / ".venv"
    this, other = f"3.{sys.version_info[1]}", f"3.{sys.version_info[1] + 1}"
    for option, says in ((f"NEEDED_PYTHON={other}", f"needs Python {other}: {sys.executable} is {this};"),
                         (f"PYTHON={tmp_path / 'python-absent'}", "is not a Python;")):
        python = option if option.startswith("PYTHON=") else f"PYTHON={sys.executable}"
        proc = subprocess.run(["make", "--no-print-directory", "install", f"VENV={venv}", python, option], cwd=REPO,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0, proc.stdout + proc.stderr
        lines = (proc.stdout + proc.stderr).strip().splitlines()
        assert len(lines) == 1 and "ragsieve needs Python" in lines[0] and says in lines[0], lines
        assert not venv.exists()
