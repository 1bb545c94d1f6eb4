"""One resolver for every spec (issue #64): each spec form resolves through ragsieve.registry (its parser half,
ragsieve.specs), and no other module under ragsieve/ splits or matches spec strings itself.

Nothing here loads a model: the table checks what a spec parses to and which loader the registry picks for it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ragsieve.errors import ModelNotAvailable, RagsieveError

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "ragsieve"


# --------------------------------------------------------------------------- (a) every spec form resolves

def _reranker_cases(folder: str):
    from ragsieve.prune.head import SentenceKeepHead
    from ragsieve.registry import load_cascade
    from ragsieve.rerank.base import RetrievalOrder
    from ragsieve.rerank.evolving import load_evolving_reranker
    from ragsieve.rerank.lexical import BM25Ranker
    from ragsieve.rerank.neural import BiEncoderRanker
    from ragsieve.rerank.pointwise import PointwiseLLMReranker
    from ragsieve.rerank.remote import RemoteRanker
    from ragsieve.rerank.shipped import load_cross_encoder, load_embedded_reranker

    return [  # spec, (scheme, argument), the loader the registry calls with the argument
        ("embedded:base", ("embedded", "base"), load_embedded_reranker),
        ("embedded:fast", ("embedded", "fast"), load_embedded_reranker),
        ("embedded", ("embedded", None), load_embedded_reranker),
        ("cascade:12", ("cascade", "12"), load_cascade),
        ("cascade:12:cross-encoder:models/x", ("cascade", "12:cross-encoder:models/x"), load_cascade),
        ("cross-encoder:cross-encoder/ms-marco-MiniLM-L-6-v2", ("cross-encoder", "cross-encoder/ms-marco-MiniLM-L-6-v2"),
         load_cross_encoder),
        ("hf:org/model", ("hf", "org/model"), load_cross_encoder),
        (folder, ("cross-encoder", folder), load_cross_encoder),  # a bare folder is a cross-encoder
        ("bi-encoder", ("bi-encoder", None), BiEncoderRanker),
        ("bi-encoder:embedded:all-minilm-l6-v2", ("bi-encoder", "embedded:all-minilm-l6-v2"), BiEncoderRanker),
        ("bm25", ("bm25", None), BM25Ranker),
        ("pointwise:fever", ("pointwise", "fever"), PointwiseLLMReranker),
        ("evolve:state/fever", ("evolve", "state/fever"), load_evolving_reranker),
        ("http://127.0.0.1:8080", ("http", "http://127.0.0.1:8080"), RemoteRanker),  # a URL is its own argument
        ("https://rerank.example/v1", ("https", "https://rerank.example/v1"), RemoteRanker),
        ("none", ("none", None), RetrievalOrder),
        ("prune-head", ("prune-head", None), SentenceKeepHead),
        ("prune-head:models/prune", ("prune-head", "models/prune"), SentenceKeepHead),
    ]


def test_every_reranker_spec_form_resolves_to_its_loader(tmp_path):
    from ragsieve.registry import RERANKERS, is_url, parse_reranker_spec

    for spec, parsed, loader in _reranker_cases(str(tmp_path)):
        assert parse_reranker_spec(spec) == parsed, spec
        assert RERANKERS[parsed[0]] is loader, spec
    assert is_url("https://h:8080") and not is_url("bm25") and not is_url("ftp://h") and not is_url(None)


def test_bad_reranker_specs_are_one_line_errors():
    from ragsieve.registry import load_reranker, parse_cascade

    with pytest.raises(RagsieveError, match=r"unknown reranker spec 'foo:bar': known schemes are bi-encoder, bm25, "):
        load_reranker("foo:bar")
    assert parse_cascade("12") == (12, None) and parse_cascade("3:bm25") == (3, "bm25")
    for bad in ("0", "x", "", None):
        with pytest.raises(RagsieveError, match=r"use cascade:<n>\[:<reranker spec>\] with n >= 1"):
            parse_cascade(bad)


def test_reranker_folders_resolve_through_the_embedded_table(tmp_path):
    from ragsieve.registry import local_reranker_folder, reranker_folder, reranker_start
    from ragsieve.rerank.shipped import ASSET_DIR

    assert reranker_folder("embedded:base") == str(ASSET_DIR) == reranker_start("embedded:base")
    assert reranker_folder(str(tmp_path)) == str(tmp_path) == reranker_folder(f"cross-encoder:{tmp_path}")
    assert reranker_folder(f"hf:{tmp_path}") == str(tmp_path)
    assert reranker_start("bm25") == "bm25" and reranker_start("embedded:all-minilm-l6-v2") == "embedded:all-minilm-l6-v2"
    with pytest.raises(RagsieveError, match="--init 'bm25': give a cross-encoder folder or embedded:base"):
        reranker_folder("bm25", "--init")
    assert local_reranker_folder(f"cross-encoder:{tmp_path}") == tmp_path == local_reranker_folder(str(tmp_path))
    assert local_reranker_folder("embedded:base") is None and local_reranker_folder("cross-encoder:org/id") is None


def test_every_model_spec_form_parses():
    from ragsieve.models.encoder import resolve_encoder_path
    from ragsieve.models.llm import OpenAIChatLLM, load_llm, resolve_llm_path
    from ragsieve.registry import EMBEDDED_MODELS, ModelSpec

    cases = {  # LLM / encoder spec → (scheme, target, model), endpoint?
        "embedded:smollm2-135m-instruct": (("embedded", "smollm2-135m-instruct", ""), False),
        "openai:http://127.0.0.1:8000/v1/#llama3": (("openai", "http://127.0.0.1:8000/v1", "llama3"), True),
        "openai:https://api.example/v1#org/model:tag": (("openai", "https://api.example/v1", "org/model:tag"), True),
        "hf:/models/x": (("hf", "/models/x", ""), False),
        "HuggingFaceTB/SmolLM2-135M-Instruct": (("hf", "HuggingFaceTB/SmolLM2-135M-Instruct", ""), False),
        "  hf:org/m  ": (("hf", "org/m", ""), False),
    }
    for spec, (fields, endpoint) in cases.items():
        parsed = ModelSpec.parse(spec)
        assert (parsed.scheme, parsed.target, parsed.model) == fields, spec
        assert parsed.is_endpoint is endpoint and ModelSpec.parse(str(parsed)) == parsed, spec
    for bad, message in (("openai:localhost#x", "bad endpoint spec"), ("openai:http://h/v1", "bad endpoint spec"),
                         ("  ", "empty model spec")):
        with pytest.raises(ModelNotAvailable, match=message):
            ModelSpec.parse(bad)
    assert {m.kind for m in EMBEDDED_MODELS.values()} == {"gguf-llm", "sentence-transformers"}
    assert resolve_encoder_path("hf:org/enc") == "org/enc"
    assert resolve_llm_path("hf:/models/x") == "/models/x" == resolve_llm_path("/models/x")
    assert isinstance(load_llm("openai:http://127.0.0.1:9/v1#m"), OpenAIChatLLM)  # a client: nothing connects yet
    with pytest.raises(ModelNotAvailable, match="is an endpoint, not a local model"):
        resolve_llm_path("openai:http://h/v1#m")
    with pytest.raises(ModelNotAvailable, match="encoders must be local"):
        resolve_encoder_path("openai:http://h/v1#m")


def test_artifact_specs_resolve_to_shipped_folders():
    from ragsieve.paths import ASSETS_DIR
    from ragsieve.pipeline.sieve_config import sieve_folder
    from ragsieve.registry import embedded_name, resolve_artifact

    assert embedded_name("embedded:smollm2-nq") == "smollm2-nq" and embedded_name("embedded:") == "default"
    assert embedded_name("probes/mine") is None and embedded_name("embedded") is None
    assert resolve_artifact("probes", "embedded:smollm2-nq") == ASSETS_DIR / "probes" / "smollm2-nq"
    assert resolve_artifact("graders", "embedded:default") == ASSETS_DIR / "graders" / "default"
    assert resolve_artifact("graders", "default") == ASSETS_DIR / "graders" / "default"  # a bare shipped name
    assert sieve_folder("embedded:default") == sieve_folder("default") == ASSETS_DIR / "sieves" / "default"
    assert sieve_folder("sieves/mine") == Path("sieves/mine")
    with pytest.raises(ModelNotAvailable, match="no probe named 'nope' is shipped or cached"):
        resolve_artifact("probes", "embedded:nope")


def test_judge_and_grader_specs_name_their_rerankers(tmp_path):
    from ragsieve.config import build_config
    from ragsieve.evolve.judges import JUDGES, JudgeSpec, ScoreJudge
    from ragsieve.grade.base import GraderConfig
    from ragsieve.registry import GRADERS, schemes_for

    cases = {  # judge spec → (kind, model, the reranker spec it scores with or None)
        "cross-encoder:embedded:base": ("cross-encoder", "embedded:base", "embedded:base"),
        f"cross-encoder:{tmp_path}": ("cross-encoder", str(tmp_path), f"cross-encoder:{tmp_path}"),
        "cross-encoder:org/ce": ("cross-encoder", "org/ce", "cross-encoder:org/ce"),
        "reranker:bi-encoder": ("reranker", "bi-encoder", "bi-encoder"),
        "llm:embedded:smollm2-135m-instruct": ("llm", "embedded:smollm2-135m-instruct", "pointwise"),
        "openai:http://h:8000/v1#m": ("openai", "openai:http://h:8000/v1#m", None),
    }
    for text, (kind, model, ranker) in cases.items():
        spec = JudgeSpec.model_validate(text)
        assert (spec.kind, spec.model) == (kind, model) and spec.label == text, text
        if ranker is not None:
            assert ScoreJudge.reranker_args(spec, None)[0] == ranker, text
    assert set(JUDGES) == set(schemes_for("judge"))
    for bad in ("llm", "llm:", "cross-encoder"):
        with pytest.raises(ValueError, match="should look like kind:model"):
            JudgeSpec.model_validate(bad)

    def ranker_spec(kind: str, base: str) -> str:
        return GRADERS[kind].ranker_spec(build_config(GraderConfig, {"kind": kind, "base": base}, "test"))

    assert ranker_spec("cosine", "embedded:all-minilm-l6-v2") == "bi-encoder:embedded:all-minilm-l6-v2"
    assert ranker_spec("cross-encoder", "embedded:base") == "embedded:base"
    assert ranker_spec("cross-encoder", "models/ce") == "cross-encoder:models/ce"
    assert ranker_spec("ranker", "bm25") == "bm25"


def test_store_urls_resolve_through_the_scheme_table():
    from ragsieve.evolve_db import locate_store
    from ragsieve.registry import is_database_url, is_index_url, schemes_for

    assert set(schemes_for("store")) == {"postgresql", "postgres", "sqlite"}
    for url in ("postgresql://rs@db/feedback", "postgres://rs@db/f", "postgresql+psycopg://rs@db/f", "SQLITE:///x.db"):
        assert is_database_url(url), url
    for name in ("state/fever", Path("postgresql://x"), "evolve:state/x"):
        assert not is_database_url(name), name
    for url in ("postgresql://me@localhost/rag?table=docs", " POSTGRES://x/rag"):
        assert is_index_url(url), url
    for name in ("index/nq", "sqlite:///x.db", "postgresql+psycopg://x/rag"):
        assert not is_index_url(name), name
    location = locate_store("postgres://rs:pw@db/feedback")
    assert location.dir is None and location.url.startswith("postgresql+psycopg://") and "pw" not in location.label
    assert locate_store("state/x").engine_url() == f"sqlite:///{Path('state/x') / 'evolve.sqlite'}"
    with pytest.raises(RagsieveError, match="the feedback store's database is PostgreSQL"):
        locate_store("sqlite:///x.db")


def test_the_scheme_table_is_the_registry_s():
    """Every scheme a loader table answers is in ragsieve.specs.SCHEMES for that kind, and back."""
    from ragsieve.paths import ASSETS_DIR
    from ragsieve.registry import EMBEDDED_RERANKERS, RERANKERS, schemes_for
    from ragsieve.rerank.shipped import CARD

    assert set(RERANKERS) == set(schemes_for("reranker"))
    assert set(schemes_for("service")) == {"http", "https"}
    shipped = {p.name for p in ASSETS_DIR.iterdir() if (p / CARD).is_file()}
    assert shipped <= set(EMBEDDED_RERANKERS.values())  # every shipped reranker folder has its embedded: name


def test_the_embedded_table_lists_every_shipped_artifact():
    from ragsieve.paths import ASSETS_DIR
    from ragsieve.registry import EMBEDDED_TABLE

    for kind in ("probe", "grader", "sieve"):
        on_disk = {f"{kind}s/{p.name}" for p in (ASSETS_DIR / f"{kind}s").iterdir() if p.is_dir()}
        assert set(EMBEDDED_TABLE[kind].values()) == on_disk, kind


# --------------------------------------------------------------------------- (b) nobody else parses specs

#: the resolver: the registry and its parser half
RESOLVER = {"ragsieve/registry.py", "ragsieve/specs.py"}
#: (file, what is split) → why that colon split is not a spec
ALLOWED = {
    ("ragsieve/machine.py", "line"): "a /proc/cpuinfo line ('model name : ...')",
    ("ragsieve/data/labelled.py", "where"): "its own 'file:line' location label",
}


def _scheme_names() -> set[str]:
    from ragsieve.specs import SCHEMES

    return set(SCHEMES)


def _is_spec_literal(value: object, schemes: set[str]) -> bool:
    """A string that starts a spec with a known scheme (``embedded:``, ``http://``, ``cross-encoder:x``) or is
    a bare ``://``/``:`` separator."""
    if not isinstance(value, str):
        return False
    if value in (":", "://"):
        return True
    head, sep, _ = value.partition(":")
    return bool(sep) and head.lower().split("+")[0] in schemes


def _constants(node: ast.AST) -> list[object]:
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    return []


def _names_scheme(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "scheme") or (isinstance(node, ast.Name)
                                                                          and node.id == "scheme")


def _spec_parsing(tree: ast.AST, schemes: set[str], rel: str = "") -> list[tuple[int, str]]:
    """(line, what) for every place ``tree`` splits or matches a spec string itself. A URL built from a host and
    a port (a server's own address) is not a spec: f-strings are checked for ``scheme:`` specs only."""
    found: list[tuple[int, str]] = []
    raising: set[int] = {id(n) for r in ast.walk(tree) if isinstance(r, ast.Raise) for n in ast.walk(r)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            method, first = node.func.attr, _constants(node.args[0])
            split = method in ("partition", "rpartition", "split", "rsplit") and ":" in first
            if split and (rel, ast.unparse(node.func.value)) not in ALLOWED:
                found.append((node.lineno, f".{method}(':')"))
            if method in ("startswith", "endswith") and any(_is_spec_literal(c, schemes) for c in first):
                found.append((node.lineno, f".{method}({first!r})"))
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_spec_literal(c, schemes) for o in operands for c in _constants(o)):
                found.append((node.lineno, "compares with a spec literal"))
            elif any(_names_scheme(o) for o in operands) and any(_constants(o) for o in operands):
                found.append((node.lineno, "compares a scheme with a literal"))
        elif isinstance(node, ast.JoinedStr) and id(node) not in raising and node.values:
            first = node.values[0]
            if isinstance(first, ast.Constant) and _is_spec_literal(first.value, schemes) and "://" not in first.value:
                found.append((node.lineno, f"builds a spec f'{first.value}...'"))
    return found


def test_no_spec_parsing_outside_the_resolver():
    """Spec strings are split, matched and built in ragsieve.registry / ragsieve.specs only: a new scheme is one
    row there, not a hunt through the package. Default values (``"embedded:base"``) and messages are fine."""
    schemes = _scheme_names()
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in RESOLVER:
            continue
        for line, what in _spec_parsing(ast.parse(path.read_text(encoding="utf-8")), schemes, rel):
            offenders.append(f"{rel}:{line}: {what}")
    assert not offenders, "spec parsing outside ragsieve.registry / ragsieve.specs:\n" + "\n".join(offenders)


def test_the_spec_parsing_check_catches_what_it_is_for():
    schemes = _scheme_names()
    caught = """
scheme, _, rest = spec.partition(":")
ok = spec.startswith("embedded:")
base = init == "embedded:base"
url = "://" not in value
endpoint = parsed.scheme == "openai"
spec = f"cross-encoder:{base}"
"""
    assert len(_spec_parsing(ast.parse(caught), schemes)) == 6
    fine = """
init = "embedded:base"
load_reranker("embedded:base")
raise ValueError(f"embedded:{name} is not shipped")
parts = line.split(",")
url = f"http://{host}:{port}"
"""
    assert _spec_parsing(ast.parse(fine), schemes) == []
