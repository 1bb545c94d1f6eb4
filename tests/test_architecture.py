"""The house plan holds: imports flow down the layers in pyproject.toml, with no cycles."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    """`lint-imports` (import-linter) over the contracts in pyproject.toml: layers and no cycles."""
    exe = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(exe), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout


def test_front_door_exports_resolve_and_stay_light():
    """`from ragsieve import X` works for every name in __all__, and importing ragsieve loads no torch."""
    code = (
        "import sys, ragsieve; assert 'torch' not in sys.modules, 'import ragsieve loaded torch'; "
        "[getattr(ragsieve, n) for n in ragsieve.__all__]; print(len(ragsieve.__all__))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.strip()) >= 10


def test_type_checking_mirror_matches_the_lazy_exports():
    """IDEs and type checkers see exactly the names `from ragsieve import X` serves."""
    import ast

    import ragsieve

    tree = ast.parse((REPO / "ragsieve" / "__init__.py").read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    mirrored = {(imp.module, a.name) for imp in guarded.body for a in imp.names}
    assert mirrored == {(module, name) for name, module in ragsieve._EXPORTS.items()}


def test_no_function_runs_over_100_lines():
    """A function too long to read at once is split into its steps (issue #64): the library's and the studies'."""
    import ast

    long = []
    for path in sorted([*(REPO / "ragsieve").rglob("*.py"), *(REPO / "studies").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 100:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})")
    assert not long, "\n".join(long)
