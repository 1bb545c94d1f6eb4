"""``make check-docs``: what README.md shows is what ragsieve does.

Three checks over the README's fenced code blocks (and the ``ragsieve ...`` commands and
``ragsieve.x.y`` names in its inline code):

1. **Flags.** Every ``ragsieve`` command shown names a real command, and every flag on it
   exists in that command's ``--help`` (which must render). ``make`` targets exist in the
   Makefile, ``python bench/x.py`` scripts and ``experiments/*.yaml`` files exist, and a
   bench script's flags appear in its source.
2. **Cheap commands run.** Commands that finish in seconds on tiny inputs (indexing a few
   passages, retrieving, grading three passages, listing the datasets) run in a scratch
   folder holding the files they name, and must exit 0. Every other command is skipped,
   with the reason printed (``--list`` shows them all): servers, studies, training and
   anything that loads an LLM take minutes to hours.
3. **Imports.** Every ``import`` / ``from ragsieve... import ...`` line in a Python block
   imports, and every dotted ``ragsieve.x.y`` name in inline code resolves.
4. **Snippets that run.** A Python block after the line ``<!-- check-docs: runs ... -->`` (the quickstart)
   runs as shown and must print exactly the ``text`` block that follows it.
5. **Architecture.** The layer diagram under "## Architecture" lists the layers of import-linter's
   "ragsieve layers" contract in ``pyproject.toml``, in order, each with the same packages.

Runs in-process (one Python, models loaded once): well under two minutes on 2 cores.

    python tools/check_docs.py [--readme README.md] [--list]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import re
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("COLUMNS", "200")  # help texts unwrapped, so a flag is never cut in two

#: commands (the words after ``ragsieve``) that are never run here, and why
SKIP = {
    "serve": "starts a server",
    "run": "a study: minutes to hours",
    "demo": "the main job: loads the LLM and answers 150 questions",
    "fit": "fits a sieve: loads an LLM, minutes at least",
    "ask": "loads an LLM",
    "probe": "loads an LLM",
    "cbdr": "a study: loads an LLM",
    "eval-retrieval": "encodes a benchmark's passage pool (minutes)",
    "prefs": "scores passages with the LLM's probe (minutes)",
    "rerank train": "trains a cross-encoder",
    "evolve": "needs an evolve store (and an LLM to step it)",
    "feedback": "needs an evolve store",
}
#: inputs a command may name that only a longer run produces
NEEDS_TRAINING = ("models/", "results/grader/models/", "prefs/", "sieves/", "store/")
OTHER_TOOLS_SKIP = {
    "curl": "talks to a running `ragsieve serve`",
    "make": "the target runs the install, the suite or the benchmarks (checked: it exists)",
    "python": "a benchmark (checked: the script and its flags exist)",
}


# -- reading the README ----------------------------------------------------------------------------


def code_blocks(text: str) -> list[tuple[str, int, str]]:
    """``(language, first line number, body)`` of each fenced block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if m:
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            blocks.append((m.group(1) or "text", start + 1, "\n".join(body)))
        i += 1
    return blocks


def shell_commands(body: str, first_line: int) -> list[tuple[str, int]]:
    """One entry per command: continuation lines joined, comment-only and blank lines dropped."""
    out, pending, start = [], "", first_line
    for offset, raw in enumerate(body.splitlines()):
        if not pending:
            start = first_line + offset
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line and not line.startswith("#"):
            out.append((line, start))
    return out


def split_words(line: str) -> list[str]:
    """Shell words without the trailing ``# comment`` (a ``#`` inside a word, as in ``openai:<url>#<model>``, stays)."""
    lex = shlex.shlex(line, posix=True)
    lex.whitespace_split, lex.commenters = True, ""
    words = []
    for word in lex:
        if word.startswith("#"):
            break
        words.append(word)
    return words


def inline_code(text: str) -> list[tuple[str, int]]:
    outside_blocks = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S | re.M)
    spans = []
    for number, line in enumerate(outside_blocks.splitlines(), 1):
        spans += [(m.group(1), number) for m in re.finditer(r"`([^`]+)`", line)]
    return spans


# -- the command line's own description ------------------------------------------------------------


def click_root():
    import typer.main

    from ragsieve.cli import app

    return typer.main.get_command(app)


def resolve(root, words: list[str]):
    """The click command ``words`` (after ``ragsieve``) names, and the words naming it."""
    cmd, path = root, []
    for word in words:
        sub = getattr(cmd, "commands", None)
        if sub is None or word.startswith("-"):
            break
        if word in sub:
            cmd = sub[word]
            path.append(word)
        elif "query" in sub:  # `ragsieve rerank QUERY ...` is the hidden `rerank query`
            cmd = sub["query"]
            path.append("query")
            break
        else:
            break
    return cmd, path


def flags_of(cmd) -> set[str]:
    flags = {"--help"}
    for param in cmd.params:
        if not getattr(param, "hidden", False):
            flags.update(param.opts)
            flags.update(param.secondary_opts)
    return flags


def shown_flags(words: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in words if w.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", w)]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    from ragsieve.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # click's --help path
            code = exc.code if isinstance(exc.code, int) else 0
    return code, out.getvalue(), err.getvalue()


# -- the scratch folder the runnable commands see ----------------------------------------------------

HAMLET = [
    ("hamlet", "Hamlet is a tragedy written by William Shakespeare around 1600.", "Hamlet"),
    ("paris", "Paris is the capital of France.", "Paris"),
    ("keys", "Rotate the keys every 90 days with the admin console.", "Keys"),
]


def scratch_inputs(root: Path) -> None:
    """The files README commands name: docs/, faq.jsonl, new_docs/, cands.jsonl, my_labels.jsonl and an index/nq
    (BM25)."""
    import json

    from ragsieve.data.records import Passage
    from ragsieve.retrieve import build_index

    (root / "docs").mkdir(parents=True)
    (root / "docs" / "keys.md").write_text("# Keys\n\nRotate the keys every 90 days with the admin console.\n")
    (root / "docs" / "plays.txt").write_text("Hamlet is a tragedy written by William Shakespeare.\n")
    (root / "new_docs").mkdir()
    (root / "new_docs" / "france.md").write_text("Paris is the capital of France.\n")
    rows = "".join(json.dumps({"id": i, "text": t, "title": title}) + "\n" for i, t, title in HAMLET)
    (root / "faq.jsonl").write_text(rows)
    (root / "cands.jsonl").write_text(rows)
    labelled = [{"query": f"about {q}", "passage": t, "label": int(q == title)}
                for q in ("Hamlet", "Paris") for _, t, title in HAMLET]
    (root / "my_labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in labelled))
    build_index([Passage(i, t, title) for i, t, title in HAMLET], root / "index" / "nq", kind="bm25")


def prepare(scratch: Path, words: list[str]) -> Path:
    """A fresh copy of the scratch inputs for one command: its output folder absent, what it extends present."""
    here = Path(tempfile.mkdtemp(prefix="cmd-", dir=scratch.parent))
    shutil.copytree(scratch, here, dirs_exist_ok=True)
    if "--out" in words and words[0] == "index":
        out = here / words[words.index("--out") + 1]
        if "--add" in words:
            run_in(here, ["index", "--passages", "docs/", "--out", str(out)])
        else:
            shutil.rmtree(out, ignore_errors=True)
    return here


def run_in(folder: Path, argv: list[str]) -> tuple[int, str, str]:
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        return run_cli(argv)
    finally:
        os.chdir(cwd)


def skip_reason(words: list[str]) -> str | None:
    path = " ".join(words[:2])
    for key in (path, words[0] if words else ""):
        if key in SKIP:
            return SKIP[key]
    if "--ray" in words:
        return "starts a Ray instance (tests/test_index_ray.py runs one)"
    if words[:1] == ["index"] and "--dataset" in words:
        return "encodes a benchmark's passage pool (minutes)"
    if words[:1] == ["index"] and "--passages" not in words:
        return "encodes a benchmark's passage pool (minutes)"
    if words[:1] == ["datasets"] and not data_available():
        return "no benchmark data here ($RAGSIEVE_DATA)"
    for word in words:
        if any(word.startswith(prefix) for prefix in NEEDS_TRAINING):
            return f"needs {word}, which a training run makes"
        if word.startswith(("postgresql://", "postgres://")):
            return "needs a PostgreSQL server with pgvector (tests/test_pgvector.py starts one)"
    if words[:1] == ["rerank"] and words[1:2] == ["eval"]:
        return "needs preference files from `prefs build`"
    return None


def data_available() -> bool:
    from ragsieve.data.loaders import default_data_dir
    from ragsieve.errors import RagsieveError

    try:
        return default_data_dir().is_dir()
    except RagsieveError:
        return False


# -- the checks -------------------------------------------------------------------------------------


def check_shell(readme: str, scratch: Path | None) -> tuple[list[str], list[str], list[str]]:
    """``(failures, ran, skipped)`` for every shell command in fenced blocks and inline ``ragsieve ...`` code."""
    root = click_root()
    failures, ran, skipped = [], [], []
    # fenced commands run when cheap; inline ones (`ragsieve grader train` in a sentence) are only checked
    commands = [(line, number, True) for lang, first, body in code_blocks(readme)
                if lang in ("bash", "sh", "shell") for line, number in shell_commands(body, first)]
    commands += [(span, number, False) for span, number in inline_code(readme)
                 if re.match(r"(\.venv/bin/)?ragsieve \S", span)]
    helps: dict[tuple[str, ...], str] = {}
    for line, number, runnable in commands:
        words = split_words(line)
        where = f"README.md:{number}"
        tool = words[0]
        if tool.endswith("/ragsieve") or tool == "ragsieve":
            args = words[1:]
            cmd, path = resolve(root, args)
            if not path or hasattr(cmd, "commands"):
                failures.append(f"{where}: `{line}`: not a ragsieve command")
                continue
            key = tuple(path)
            if key not in helps:
                code, out, err = run_cli([*path, "--help"])
                if code != 0:
                    failures.append(f"{where}: `ragsieve {' '.join(path)} --help` failed: {err.strip()[:200]}")
                helps[key] = out
            known = flags_of(cmd)
            for flag in shown_flags(args):
                if flag not in known or flag not in helps[key]:
                    failures.append(f"{where}: `ragsieve {' '.join(p for p in path if p != 'query')}` has no {flag}")
            for word in args:
                if word.startswith("experiments/") and not (REPO / word).is_file():
                    failures.append(f"{where}: {word} does not exist")
            reason = skip_reason(args) if runnable else "inline in a sentence: flags checked only"
            if reason or scratch is None:
                skipped.append(f"{where}: ragsieve {' '.join(args)[:90]}  [{reason or 'not running commands'}]")
                continue
            folder = prepare(scratch, args)
            start = time.perf_counter()
            code, out, err = run_in(folder, args)
            if code != 0:
                failures.append(f"{where}: `{line}` exited {code}: {(err or out).strip()[-300:]}")
            ran.append(f"{where}: ragsieve {' '.join(args)[:90]}  ({time.perf_counter() - start:.1f}s, exit {code})")
        elif tool == "make":
            makefile = (REPO / "Makefile").read_text()
            for target in words[1:]:
                if not re.search(rf"^{re.escape(target)}:", makefile, flags=re.M):
                    failures.append(f"{where}: the Makefile has no target '{target}'")
            skipped.append(f"{where}: {line[:90]}  [{OTHER_TOOLS_SKIP['make']}]")
        elif tool == "python" and len(words) > 1 and words[1].endswith(".py"):
            script = REPO / words[1]
            if not script.is_file():
                failures.append(f"{where}: {words[1]} does not exist")
            else:
                source = script.read_text()
                failures += [f"{where}: {words[1]} has no {flag}" for flag in shown_flags(words[2:])
                             if flag not in source]
            for word in words[2:]:
                if word.startswith("experiments/") and not (REPO / word).is_file():
                    failures.append(f"{where}: {word} does not exist")
            skipped.append(f"{where}: {line[:90]}  [{OTHER_TOOLS_SKIP['python']}]")
        else:
            skipped.append(f"{where}: {line[:90]}  [{OTHER_TOOLS_SKIP.get(tool, 'not a ragsieve command')}]")
    return failures, ran, skipped


def check_imports(readme: str) -> list[str]:
    failures = []
    for lang, first, body in code_blocks(readme):
        if lang != "python":
            continue
        for offset, line in enumerate(body.splitlines()):
            statement = line.split("#", 1)[0].strip()
            if re.match(r"(from\s+ragsieve[\w.]*\s+import\s|import\s+ragsieve)", statement):
                try:
                    exec(statement, {})  # noqa: S102 - an import line from our own README
                except Exception as exc:  # noqa: BLE001 - any failure is what this check reports
                    failures.append(f"README.md:{first + offset}: `{statement}` fails: {type(exc).__name__}: {exc}")
    for span, number in inline_code(readme):
        name = re.match(r"^(ragsieve(?:\.\w+)+)", span)
        if name and not resolves(name.group(1)):
            failures.append(f"README.md:{number}: `{name.group(1)}` does not exist")
    return failures


RUNS_MARK = "<!-- check-docs: runs"


def runnable_snippets(readme: str) -> list[tuple[int, str, str]]:
    """``(line, code, printed)``: each Python block marked ``<!-- check-docs: runs ... -->`` on the line before
    it, with the ``text`` block that follows it (what it prints)."""
    lines, blocks, found = readme.splitlines(), code_blocks(readme), []
    for (lang, first, body), after in zip(blocks, blocks[1:] + [("", 0, "")]):
        before = [line for line in lines[: first - 2] if line.strip()][-1:]  # the line before the fence
        if lang == "python" and before and before[0].startswith(RUNS_MARK):
            if after[0] != "text":
                raise SystemExit(f"README.md:{first}: a `{RUNS_MARK}` block needs the text block it prints after it")
            found.append((first, body, after[2]))
    return found


def check_snippets(readme: str) -> tuple[list[str], list[str]]:
    """``(failures, ran)``: every marked snippet runs in a fresh namespace and prints its text block."""
    failures, ran = [], []
    for line, code, printed in runnable_snippets(readme):
        out, start = io.StringIO(), time.perf_counter()
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(code, f"README.md:{line}", "exec"), {"__name__": "__readme__"})  # noqa: S102 - our README
        except Exception as exc:  # noqa: BLE001 - any failure is what this check reports
            failures.append(f"README.md:{line}: the snippet fails: {type(exc).__name__}: {exc}")
            continue
        if out.getvalue().strip() != printed.strip():
            failures.append(f"README.md:{line}: the snippet prints {out.getvalue().strip()!r}, the README shows "
                            f"{printed.strip()!r}")
        ran.append(f"README.md:{line}: python snippet ({time.perf_counter() - start:.1f}s)")
    return failures, ran


def check_architecture(readme: str, pyproject: str) -> list[str]:
    """The "## Architecture" diagram against import-linter's layers contract (``studies`` above it aside)."""
    import tomllib

    contracts = tomllib.loads(pyproject)["tool"]["importlinter"]["contracts"]
    layers = next(c["layers"] for c in contracts if c.get("name") == "ragsieve layers")
    want = [{p.strip().removeprefix("ragsieve.") for p in layer.split("|")} for layer in layers]
    heading = readme.find("\n## Architecture")
    if heading < 0:
        return []
    line = readme[:heading].count("\n") + 2
    block = next((body for lang, first, body in code_blocks(readme) if first > line), "")
    shown = [{p.strip() for p in re.sub(r"\(.*\)", "", row).split("|")} for row in block.splitlines()
             if row.strip() and not row.startswith("studies")]
    if shown == want:
        return []
    missing = sorted(set().union(*want) - set().union(*shown))
    extra = sorted(set().union(*shown) - set().union(*want))
    return [f"README.md:{line}: the Architecture diagram is not pyproject.toml's layers contract"
            + (f" (missing: {', '.join(missing)})" if missing else "") + (f" (not a layer: {', '.join(extra)})" if extra
                                                                        else "") + (" (order or grouping)" if not
                                                                                   (missing or extra) else "")]


def resolves(dotted: str) -> bool:
    """``ragsieve.a.b.Name``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=REPO / "README.md")
    parser.add_argument("--list", action="store_true", help="Also list every command run and skipped, with why.")
    parser.add_argument("--no-run", action="store_true", help="Check flags and imports only; run nothing.")
    args = parser.parse_args(argv)
    readme = args.readme.read_text(encoding="utf-8")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ragsieve-check-docs-") as tmp:
        scratch = None
        if not args.no_run:
            scratch = Path(tmp) / "inputs"
            scratch_inputs(scratch)
        failures, ran, skipped = check_shell(readme, scratch)
    failures += check_imports(readme)
    failures += check_architecture(readme, (REPO / "pyproject.toml").read_text(encoding="utf-8"))
    if not args.no_run:
        snippet_failures, snippets_ran = check_snippets(readme)
        failures += snippet_failures
        ran += snippets_ran
    if args.list:
        print("ran:\n  " + "\n  ".join(ran))
        print("skipped (flags checked):\n  " + "\n  ".join(skipped))
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    print(f"check-docs: {len(ran)} command(s) run, {len(skipped)} skipped, {len(failures)} problem(s) "
          f"in {time.perf_counter() - start:.0f}s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
