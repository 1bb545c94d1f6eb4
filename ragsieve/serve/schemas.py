"""Request and response bodies: the Cohere/Jina rerank shape, TEI's, and ragsieve's own.

Request models ignore unknown fields (clients send ``rank_fields``, ``max_tokens_per_doc``,
``truncate`` ...), so any client of those APIs works unchanged; responses are typed so
``/openapi.json`` documents them.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class DocumentIn(_Request):
    """A document as an object (Cohere v1 / Jina); only ``text`` is read."""

    text: str


Document = Union[str, DocumentIn]


class RerankRequest(_Request):
    """Cohere v1/v2 and Jina rerank body. ``model`` is accepted and ignored (the response names the served model)."""

    query: str = Field(..., min_length=1)
    documents: list[Document]
    model: str | None = None
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False


class TEIRerankRequest(_Request):
    """Text Embeddings Inference's ``/rerank`` body.

    ``score`` is in [0, 1] (the calibrated probability, as for ``/v1/rerank``); ``raw_scores: true``
    returns the logit instead (a sigmoid-output ranker's mapped back; BM25 & co. their raw score). ``truncate`` is
    accepted for compatibility and changes nothing: long texts are chunked, never truncated.
    """

    query: str = Field(..., min_length=1)
    texts: list[str]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False


class FilterRequest(RerankRequest):
    """The sieve over the documents: rerank, cut to ``top_n`` (default: the server's ``top_k``), keep those
    graded relevant. ``threshold`` overrides the configured grader's (without a grader it thresholds the
    reranker's own scores).

    Scores and ``threshold`` are on the [0, 1] scale of ``/v1/rerank`` (the graders' and rankers'
    :meth:`~ragsieve.rerank.base.BaseRanker.unit_scores`), so a Cohere / Open WebUI / Dify-style threshold
    means the same on both. ``raw_scores: true`` answers the models' raw scores and takes ``threshold`` on the
    grader's raw scale instead (the scale a sieve's ``sieve.json`` and a grader folder store). Those are the
    models' own scores, as ``score()`` gives them: unlike TEI's ``raw_scores``, a sigmoid-output model's are not
    mapped to logits, because its stored threshold is not.
    """

    raw_scores: bool = Field(
        False, description="true: scores and threshold on the models' raw scale (as a sieve.json stores it), "
        "not in [0, 1]",
    )
    threshold: float | None = Field(
        None, allow_inf_nan=False,
        description="keep documents whose grade_score is >= threshold; in [0, 1] (the grade_score scale), or "
        "the grader's raw scale with raw_scores: true. Default: the configured grader's",
    )

    prune: bool | float | None = Field(
        None, allow_inf_nan=False,
        description="cut each kept document to its sentences the reranker scores >= a threshold (always its best "
        "one): true uses the served sieve's prune threshold, a number is the threshold (in [0, 1], raw with "
        "raw_scores: true), false keeps documents whole. Default: as the served sieve does",
    )

    prune_token_cap: int | None = Field(
        None, ge=1,
        description="cut the kept documents together: their best sentences (by the sentence scorer, at or above the "
        "prune threshold when one is sent) as long as they fit in this many tokens in all, always the best one; a "
        "document left without a sentence is dropped. Default: as the served sieve does",
    )

    @field_validator("prune")
    @classmethod
    def _unit_prune(cls, value: bool | float | None, info: ValidationInfo) -> bool | float | None:
        if isinstance(value, bool) or value is None:
            return value
        if not info.data.get("raw_scores") and not 0.0 <= value <= 1.0:
            raise ValueError(f"{value} is not in [0, 1] (the relevance_score scale; send raw_scores: true for the "
                             "reranker's raw scale, or true / false)")
        return value

    @field_validator("threshold")
    @classmethod
    def _unit_threshold(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and not info.data.get("raw_scores") and not 0.0 <= value <= 1.0:
            raise ValueError(f"{value} is not in [0, 1] (the grade_score scale; send raw_scores: true for the "
                             "grader's raw scale)")
        return value


class GateRequest(_Request):
    query: str = Field(..., min_length=1)
    beta: float | None = Field(None, ge=0.0, le=1.0)  # overrides the configured β


class AskRequest(_Request):
    query: str = Field(..., min_length=1)


class GateResponse(BaseModel):
    confidence: float  # Conf(Q): the probe's P(the LLM answers correctly closed-book)
    retrieve: bool  # Conf(Q) <= beta
    beta: float


class Context(BaseModel):
    id: str
    text: str
    title: str = ""


class AskResponse(BaseModel):
    answer: str
    retrieved: bool
    confidence: float | None = None
    contexts: list[Context] = []
    graded_out: int = 0
    seconds: float


class DocumentOut(BaseModel):
    text: str


class RerankResult(BaseModel):
    index: int
    relevance_score: float = Field(
        ..., description="in [0, 1]: the reranker's calibrated probability (BaseRanker.unit_scores)"
    )
    document: DocumentOut | None = None


class PrunedOut(BaseModel):
    """What pruning kept of one document: the text that goes to the LLM and where it came from."""

    text: str
    kept_spans: list[tuple[int, int]] = Field(..., description="[start, end) character offsets into the document")
    sentences: int
    kept_sentences: int
    tokens_before: int = Field(..., description="the document's tokens (the reranker's tokenizer)")
    tokens_after: int


class FilteredDocument(RerankResult):
    """One kept document of ``/v1/filter`` (the HTTP shape of a :class:`~ragsieve.pipeline.stages.FilterResult`)."""

    relevance_score: float = Field(
        ..., description="the reranker's score: in [0, 1] as /v1/rerank answers it (BaseRanker.unit_scores), "
        "its raw score with raw_scores: true",
    )
    relevant: bool
    grade_score: float = Field(
        ..., description="the grader's score (the reranker's without a grader), on the scale of threshold: "
        "in [0, 1] (BaseRanker.unit_scores), raw with raw_scores: true",
    )
    pruned: PrunedOut | None = Field(None, description="present when the document was pruned to its sentences")


class Meta(BaseModel):
    """Cohere's ``meta`` (clients parse ``api_version``, ``billed_units``, ``warnings``) plus ragsieve's details."""

    api_version: dict = {"version": "2"}
    billed_units: dict = {"search_units": 1}
    warnings: list[str] = []
    chunked_documents: dict[int, int] = {}  # document index -> chunks scored (longer than the model window)
    truncated_documents: list[int] = []  # documents longer than max_chunks_per_doc chunks: the tail was not read
    # the process's passage-vector cache so far (hits, misses, hit_ratio, entries, bytes; stored: vectors an
    # index supplied); absent for a reranker that encodes no passages
    embedding_cache: dict | None = None
    request_id: str = ""


class RerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    meta: Meta
    usage: dict = {}


class TEIRerankResult(BaseModel):
    index: int
    score: float
    text: str | None = None


class FilterResponse(BaseModel):
    id: str
    model: str
    grader: str
    threshold: float | None = Field(
        None, description="the cut applied: grade_score >= threshold; in [0, 1], or raw with raw_scores: true; "
        "absent when nothing was graded (a served sieve without a grader keeps its top_k)"
    )
    raw_scores: bool = Field(False, description="true: scores and threshold are on the models' raw scale")
    results: list[FilteredDocument]  # kept documents, best first
    dropped: int  # documents not kept: cut by top_n / top_k or graded irrelevant
    prune_threshold: float | None = Field(
        None, description="the sentence cut pruning used (the scale of threshold); absent when nothing was pruned")
    prune_rule: dict[str, Any] | None = Field(
        None, description="how the pruning chose: scope (passage: each document on its own; across: the kept "
        "documents together), max_sentences, token_cap; absent when nothing was pruned")
    meta: Meta


class FeedbackResponse(BaseModel):
    stored: int  # rows written (a chosen/rejected pair is two)
    pending: int  # rows waiting for the next `ragsieve evolve step`
    request_id: str = ""


class ErrorBody(BaseModel):
    error: str
    request_id: str = ""


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    owned_by: str = "ragsieve"
    kind: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: str
    model: str
    batches: int
    pairs: int
    replica: str | None = None  # on Ray Serve: the replica that answered
