"""The one resolver: spec strings → rerankers, graders, probes (real class references, no strings).

This module is the resolver: it maps every scheme to its loader. Its parser half, the grammar and the
``embedded:`` table, is :mod:`ragsieve.specs` (re-exported here): the layers below this one (``models``,
``probe``, ``retrieve``, ``evolve_db``) must read specs too and may not import this module, so the parser sits at
the bottom of the layers and loads nothing. Nothing else splits a spec string (``tests/test_spec_resolver.py``).

Every loader the CLI, the pipeline, the studies and the judges use goes through here, so
a spec means the same thing everywhere (``load_reranker(spec, calibration=path)`` adds a calibration fitted
on the user's own labelled pairs, ``ragsieve rerank calibrate``):

============================  ================================================================
reranker spec                 what loads
============================  ================================================================
``embedded:base``             ragsieve's own cross-encoder, shipped in the package
``embedded:fast``             ``embedded:base`` behind a cascade: cosine over every candidate, the
                              cross-encoder on the best ``FAST_TOP`` by cosine only
``cascade:<n>[:<spec>]``       the same cascade with ``n`` cross-encoded candidates per query, over
                              ``embedded:base`` or any cross-encoder spec
``cross-encoder:<dir or id>``  any sentence-transformers CrossEncoder (a bare folder too; a
                              folder with ``ragsieve_reranker.json`` scores as its card says)
``hf:<id or dir>``            the same, named the way LLM specs name HF models
``bi-encoder[:<encoder>]``    cosine of MiniLM (or any encoder) embeddings
``bm25``                      BM25 over the candidate list
``pointwise:<template>``      a causal LM's P(true) under a verdict template (``llm=`` kwarg)
``evolve:<store>``            the evolving reranker of an evolve store, after its last round
``http(s)://<host>``          a ``ragsieve serve`` / Cohere-compatible endpoint (``api_key=``)
``none``                      keep the retriever's order
``prune-head[:<dir>]``        a pruner's sentence scorer: the cross-encoder in ``dir`` (default
                              ``embedded:base``'s) read once per passage + its keep head
                              (``prune_head.safetensors``), see :mod:`ragsieve.prune.head`; or
                              a keep head's file (``prune-head:<file>``, or the bare path: a
                              fitted sieve's own) on ``embedded:base``'s cross-encoder
============================  ================================================================

Every row is a real class (or the function that builds one) in :data:`RERANKERS`;
:func:`reranker_folder` is the same resolution for code that needs a folder to train from.

Named artifacts resolve like ``embedded:base``: ``embedded:<name>`` is looked up in the
package's ``assets/`` folder, then in ``$RAGSIEVE_CACHE``; anything else is a path. A
missing artifact is one line that says how to build it.

Every other kind of spec, and where its scheme → loader table is (:data:`~ragsieve.specs.SCHEMES` lists every
scheme and the kinds it is valid for; ``tests/test_spec_resolver.py`` holds the tables to it):

=================  =====================================  ============================================================
kind               parsed by (:mod:`ragsieve.specs`)      loaded by
=================  =====================================  ============================================================
reranker           :func:`parse_reranker_spec`            :func:`load_reranker` (:data:`RERANKERS`)
grader             :func:`embedded_name` / a folder       :func:`load_grader`, :func:`new_grader` (:data:`GRADERS`)
probe, sieve       :func:`embedded_name` / a folder       :func:`load_probe`, :func:`sieve_folder`
LLM, encoder       :class:`ModelSpec`                     ``ragsieve.models.load_llm`` / ``load_encoder``: below this
                                                          layer, since rerankers, probes and indexes load models too
judge              :func:`parse_judge_spec`               ``ragsieve.evolve.judges.JUDGES``: above this layer (a
                                                          judge is built from rerankers and LLMs)
evolve store       :func:`is_database_url`                ``ragsieve.evolve_db.locate_store``
index              :func:`is_index_url`                   ``ragsieve.retrieve.load_index``
=================  =====================================  ============================================================

Example::

    from ragsieve.registry import load_reranker, load_grader, new_grader
    load_reranker("bm25").top_k("who wrote hamlet", ["Shakespeare wrote Hamlet.", "Paris"], 1)
    grader = new_grader("cosine")          # MiniLM cosine + a threshold to fit
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ragsieve.artifacts import GRADER_REBUILD, check_safetensors, file_sha256, reading_artifact
from ragsieve.config import build_config
from ragsieve.errors import RagsieveError
from ragsieve.grade.base import WEIGHTS_FILE, Grader, GraderConfig, read_grader_config
from ragsieve.grade.lm import ClassifierGrader, GenerativeGrader, HeadGrader, LoraGrader, PromptedGrader
from ragsieve.grade.ranker import CosineGrader, CrossEncoderGrader, RankerGrader
from ragsieve.paths import resolve_artifact, shipped_name
from ragsieve.prune.head import HEAD_FILE, SentenceKeepHead
from ragsieve.rerank.base import BaseRanker, RetrievalOrder
from ragsieve.rerank.chunks import reading_key, reading_whole
from ragsieve.rerank.evolving import load_evolving_reranker
from ragsieve.rerank.lexical import BM25Ranker
from ragsieve.rerank.neural import BiEncoderRanker
from ragsieve.rerank.pointwise import PointwiseLLMReranker
from ragsieve.rerank.remote import RemoteRanker
from ragsieve.rerank.shipped import ASSET_DIR, base_reranker_dir, load_cross_encoder, load_embedded_reranker
from ragsieve.specs import (  # noqa: F401  (re-exported: the registry is where a spec is resolved)
    EMBEDDED_MODELS, EMBEDDED_RERANKERS, EMBEDDED_TABLE, SCHEMES, ModelSpec, cross_encoder_argument,
    embedded_name, embedded_reranker_asset, is_database_url, is_index_url, is_service_url, parse_cascade,
    parse_judge_spec, parse_reranker_spec, schemes_for, split_spec,
)

if TYPE_CHECKING:
    from ragsieve.models.llm import LocalLLM
    from ragsieve.rerank.calibration import Calibration
    from ragsieve.probe.model import ConfidenceProbe

#: the reranker a cascade cross-encodes with, and what fine-tuning starts from, when none is named
DEFAULT_RERANKER = "embedded:base"


def load_cascade(arg: str, **kwargs: Any) -> BaseRanker:
    """``cascade:<n>`` (over ``embedded:base``) or ``cascade:<n>:<reranker spec>``: a
    :class:`~ragsieve.rerank.cascade.CascadeRanker` cross-encoding the best ``n`` candidates by cosine."""
    from ragsieve.rerank.cascade import CascadeRanker

    top, inner = parse_cascade(arg)
    return CascadeRanker(load_reranker(inner or DEFAULT_RERANKER, whole_passages=False, **kwargs), top)


#: reranker spec scheme → class or factory; a spec "scheme:arg" passes arg as the first argument
#: (a URL passes itself whole, a bare folder is a cross-encoder).
RERANKERS: dict[str, Callable[..., BaseRanker]] = {
    "bm25": BM25Ranker,
    "bi-encoder": BiEncoderRanker,
    "cross-encoder": load_cross_encoder,  # a folder with a ragsieve card keeps its cosine mix
    "hf": load_cross_encoder,
    "embedded": load_embedded_reranker,
    "pointwise": PointwiseLLMReranker,
    "evolve": load_evolving_reranker,
    "http": RemoteRanker,
    "https": RemoteRanker,
    "none": RetrievalOrder,
    "cascade": load_cascade,
    "prune-head": SentenceKeepHead,
}

#: grader kind → class
GRADERS: dict[str, type[Grader]] = {
    "prompted": PromptedGrader,
    "generative": GenerativeGrader,
    "head": HeadGrader,
    "classifier": ClassifierGrader,
    "lora": LoraGrader,
    "ranker": RankerGrader,
    "cosine": CosineGrader,
    "cross-encoder": CrossEncoderGrader,
}

#: an ``http(s)://`` service URL (a :class:`~ragsieve.rerank.remote.RemoteRanker` spec)
is_url = is_service_url


def load_reranker(spec: "str | BaseRanker", *, whole_passages: bool = True, **kwargs: Any) -> BaseRanker:
    """A reranker from its spec (table above); an already built ranker is returned as it is.

    A model that reads at most a window of tokens per pair (the cross-encoders, MiniLM) scores a longer
    passage by its best window-sized chunk (:class:`~ragsieve.rerank.chunks.BestChunkRanker`), as ``serve``
    and the sieve do, so ``score`` and ``predict_proba`` are what ``/v1/rerank`` answers for any passage;
    ``whole_passages=False`` gives the model reading the first window only (what the studies' records hold).

    Example::

        load_reranker("cross-encoder:results/rerank/base").top_k(query, passages, 3)
        load_reranker("pointwise:fever", llm="embedded:smollm2-135m-instruct")
        load_reranker("http://127.0.0.1:8080", api_key="k")
    """
    if isinstance(spec, BaseRanker):
        return spec
    calibration_file = kwargs.pop("calibration", None)
    name, arg = parse_reranker_spec(spec)
    try:
        factory = RERANKERS[name]
    except KeyError:
        raise RagsieveError(f"unknown reranker spec '{spec}': known schemes are {', '.join(sorted(RERANKERS))}, "
                            "or a cross-encoder folder") from None
    calibration = read_calibration(calibration_file, spec) if calibration_file else None  # refused before loading
    ranker = factory(arg, **kwargs) if arg is not None else factory(**kwargs)
    if whole_passages:
        ranker = reading_whole(ranker)
    if calibration is not None:
        ranker.calibration = calibration
    return ranker


def read_calibration(path: "str | Path", spec: str) -> "Calibration":
    """The calibration a :class:`~ragsieve.rerank.calibration.CalibrationFile` holds, for the reranker ``spec``;
    refused (one line) when the file was fitted on other weights, or on another reranker than ``spec``.

    Example::

        load_reranker("embedded:base").calibration = read_calibration("my-calibration.json", "embedded:base")
    """
    from ragsieve.config import load_config
    from ragsieve.rerank.calibration import CalibrationFile

    if not Path(path).is_file():
        raise RagsieveError(f"calibration {path}: no such file (write one with `ragsieve rerank calibrate`)")
    fitted = load_config(CalibrationFile, path)
    weights = cross_encoder_key(spec)
    if fitted.ranker_weights or weights:
        if fitted.ranker_weights != weights:  # one model's score scale: on other weights it means nothing
            raise RagsieveError(f"calibration {path} was fitted on {fitted.reranker} (weights "
                                f"{fitted.ranker_weights}), not on {spec} (weights {weights}): fit it again "
                                f"with `ragsieve rerank calibrate --reranker {spec}`")
    elif fitted.reranker != spec:
        raise RagsieveError(f"calibration {path} was fitted on {fitted.reranker}, not on {spec}: fit it again "
                            f"with `ragsieve rerank calibrate --reranker {spec}`")
    return fitted.calibration


def reranker_folder(spec: str, what: str = "init") -> str:
    """A cross-encoder folder fine-tuning can start from: a folder, ``cross-encoder:<folder>`` or ``embedded:base``.

    ``what`` names the option in the error (``align.init``, ``--init``, ...).

    Example::

        reranker_folder("embedded:base")       # '.../ragsieve/assets/base-reranker'
    """
    if Path(spec).is_dir():
        return spec
    argument = cross_encoder_argument(spec)
    if argument and Path(argument).is_dir():
        return argument
    start = reranker_start(spec)
    if start != spec:  # embedded:base: its shipped folder
        return start
    raise RagsieveError(f"{what} '{spec}': give a cross-encoder folder or {DEFAULT_RERANKER}")


def reranker_start(spec: str) -> str:
    """What fine-tuning starts from: the shipped base's folder for ``embedded:base``; any other spec (a folder, an
    HF id, an encoder spec for a new head) as given.

    Example::

        reranker_start("embedded:base")       # '.../ragsieve/assets/base-reranker'
    """
    if embedded_reranker_asset(spec) == EMBEDDED_RERANKERS["base"]:
        return str(base_reranker_dir())
    return spec


def local_reranker_folder(spec: str) -> Path | None:
    """The folder on disk a ``cross-encoder:`` / ``hf:`` spec (or a bare folder) names; None for anything else
    (a registry name such as ``bm25`` or ``embedded:base``, an HF id)."""
    argument = cross_encoder_argument(spec)
    return Path(argument) if argument and Path(argument).is_dir() else None


def grader_class(kind: str) -> type[Grader]:
    """The class registered for ``kind``; one-line error naming the known kinds."""
    try:
        return GRADERS[kind]
    except KeyError:
        raise RagsieveError(f"unknown grader kind '{kind}'; known: {', '.join(GRADERS)}") from None


def _build(cls: type[Grader], config: GraderConfig) -> Grader:
    if issubclass(cls, RankerGrader):  # the ranker comes from its spec, here, where specs resolve
        weights = cross_encoder_key(config.base)
        calibrated = config.trained.get("ranker_weights")
        # a threshold is a point on one model's score scale: on other weights it means nothing
        if calibrated and weights and calibrated != weights:
            raise RagsieveError(f"grader threshold {config.threshold} was set on {config.base} weights {calibrated}, "
                                f"which are now {weights}: fit the threshold again (e.g. python bench/fit.py "
                                "--regrade for the shipped sieve, experiments/grader_scale.yaml for the default)")
        grader = cls(config, load_reranker(cls.ranker_spec(config)))
        grader.ranker_weights = weights
        return grader
    return cls.create(config)


def cross_encoder_key(spec: str) -> str | None:
    """Key of the cross-encoder weights (and cosine mix) ``spec`` names; None when it is not a local cross-encoder."""
    from ragsieve.rerank.shipped import scoring_key

    try:
        folder = Path(reranker_folder(spec, "base"))
    except RagsieveError:
        return None
    return scoring_key(folder) if (folder / "model.safetensors").is_file() else None


def reranker_scores_key(spec: str, whole_passages: bool = True) -> str | None:
    """Key of the scores ``load_reranker(spec, whole_passages=...)`` gives (for stores of them): its weights
    (:func:`cross_encoder_key`) and how it reads a passage past its window; None when ``spec`` is not a local
    cross-encoder.

    A keep head (``prune-head[:dir]``) is keyed by its own file, which carries the cross-encoder's key.

    Example::

        reranker_scores_key("embedded:base")   # '<weights>-mix0.25-best-chunk8'
    """
    scheme, argument = parse_reranker_spec(spec)
    if scheme == "prune-head":
        head = Path(argument) if argument and Path(argument).is_file() else Path(argument or ASSET_DIR) / HEAD_FILE
        return f"prune-head-{file_sha256(head)[:12]}" if head.is_file() else None
    weights = cross_encoder_key(spec)
    return None if weights is None else f"{weights}-{reading_key(whole_passages)}"


def new_grader(kind: str, base: str | None = None, **options: Any) -> Grader:
    """A fresh (untrained) grader of ``kind`` on ``base`` (default: the kind's default model).

    ``options`` are :class:`~ragsieve.grade.base.GraderConfig` fields (``max_length``, ``lora_r``, ...).

    Example::

        new_grader("lora", lora_r=16, lora_alpha=32, max_passage_tokens=192)
        new_grader("ranker", base="embedded:base", threshold=0.5)
    """
    cls = grader_class(kind)
    base = base or cls.default_base
    if not base:
        raise RagsieveError(f"a '{kind}' grader needs a base model")
    config = build_config(GraderConfig, {"kind": kind, "base": cls.normalize_base(base), **options}, "grader options")
    return _build(cls, config)


def load_grader(spec: str | Path, base: str | None = None) -> Grader:
    """A saved grader: a folder written by :meth:`Grader.save`, or ``embedded:<name>``.

    ``base``, when given, must be the model the grader was trained on; a grader is
    refused on any other base (its weights would be meaningless there).
    """
    path = resolve_artifact("graders", spec)
    config = read_grader_config(path)
    cls = grader_class(config.kind)
    if base is not None and cls.normalize_base(base) != config.base:
        raise RagsieveError(
            f"grader at {path} was trained on '{config.base}', not '{cls.normalize_base(base)}'; "
            "train one for that model"
        )
    weights = path / WEIGHTS_FILE
    if weights.is_file():  # a truncated file is caught from its header before the base model loads
        check_safetensors(weights, GRADER_REBUILD)
    if issubclass(cls, RankerGrader) and (path / config.base).exists():  # a ranker shipped beside the grader
        config = config.model_copy(update={"base": str((path / config.base).resolve())})
    grader = _build(cls, config)
    with reading_artifact(weights, GRADER_REBUILD):
        grader._load_weights(path)
    return grader


def sieve_folder(spec: str | Path) -> Path:
    """A sieve's folder: ``embedded:<name>`` (shipped or cached), a bare shipped name, or a path as given (a
    missing one is reported by :func:`~ragsieve.pipeline.sieve_config.read_sieve_config`, which knows the file)."""
    text = str(spec)
    if embedded_name(text) is not None or shipped_name("sieves", text):
        return resolve_artifact("sieves", spec)
    return Path(spec).expanduser()


def load_probe(spec: str | Path, llm: "LocalLLM", **kwargs: Any) -> "ConfidenceProbe":
    """A saved knowledge-boundary probe (a folder or ``embedded:<name>``) for ``llm``."""
    from ragsieve.probe.model import ConfidenceProbe

    if not hasattr(llm, "tokenizer"):
        raise RagsieveError("the probe reads hidden states: it needs a local LLM, not an endpoint")
    return ConfidenceProbe.load(resolve_artifact("probes", spec), llm, **kwargs)
