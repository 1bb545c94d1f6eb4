"""Generative LLMs behind one interface.

:class:`LocalLLM` wraps any HF causal LM (the embedded SmolLM2 by default) and is what
the probe reads hidden states from; :class:`OpenAIChatLLM` talks to an
OpenAI-compatible server (vLLM, Ollama, ...) for users who serve big models.
Both expose ``generate(user_messages, ...) -> list[str]``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Protocol, Sequence

from ragsieve.artifacts import cache_rebuild, check_model_folder
from ragsieve.atomic import atomic_directory
from ragsieve.errors import ModelNotAvailable, RagsieveError
from ragsieve.specs import DEFAULT_LLM, ModelSpec, get_embedded
from ragsieve.paths import cache_dir
from ragsieve.progress import report

if TYPE_CHECKING:
    import numpy as np
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# Bump when the cached layout changes so stale caches are rebuilt, not misread.
_CACHE_FORMAT = "1"


class Generator(Protocol):
    """Anything that turns user messages into answers."""

    spec: str

    def generate(
        self,
        user_messages: Sequence[str],
        *,
        system: str | None = None,
        max_new_tokens: int = 32,
        batch_size: int = 8,
    ) -> list[str]: ...


@dataclass
class GenerationStats:
    prompts: int = 0
    new_tokens: int = 0
    seconds: float = 0.0


class LocalLLM:
    """A local HF causal LM with its tokenizer.

    Example::

        llm = load_llm()  # embedded SmolLM2-135M-Instruct
        llm.generate(["What is the capital of France?"], max_new_tokens=8)
    """

    def __init__(self, model: "PreTrainedModel", tokenizer: "PreTrainedTokenizerBase", spec: str):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.spec = spec
        if tokenizer.pad_token is None:  # batching needs one; eos is the usual choice
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.padding_side = "left"  # the last position must be the last prompt token
        self.stats = GenerationStats()

    # -- architecture facts the probe needs ---------------------------------
    @property
    def num_layers(self) -> int:
        return int(self.model.config.num_hidden_layers)

    @property
    def hidden_size(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048) or 2048)

    @property
    def device(self) -> "torch.device":
        return next(self.model.parameters()).device

    # -- prompts --------------------------------------------------------------
    def format_prompt(self, user_message: str, system: str | None = None) -> str:
        """Apply the chat template (with generation prompt) when the tokenizer has one."""
        return chat_prompt(self.tokenizer, user_message, system)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def truncate_tokens(self, text: str, max_tokens: int) -> tuple[str, bool]:
        """Cut ``text`` to at most ``max_tokens`` tokens; returns (text, was_truncated)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_tokens:
            return text, False
        return self.tokenizer.decode(ids[: max(max_tokens, 0)]), True

    # -- scoring ----------------------------------------------------------------
    def continuation_logprob(self, prompts: Sequence[str], continuations: Sequence[str], *,
                             batch_size: int = 8) -> "np.ndarray":
        """Mean log-probability per token of each continuation right after its (already formatted) prompt: how
        readily this LLM would say a gold answer given a context, one teacher-forced forward per pair (RECOMP
        labels a compressor's sentences by it).

        Example::

            llm.continuation_logprob([llm.format_prompt("Who wrote Hamlet?")], ["William Shakespeare"])
        """
        import numpy as np
        import torch

        if len(prompts) != len(continuations):
            raise RagsieveError(f"{len(prompts)} prompts but {len(continuations)} continuations")
        pairs = [(self.tokenizer(p, add_special_tokens=False)["input_ids"],
                  self.tokenizer(c, add_special_tokens=False)["input_ids"]) for p, c in zip(prompts, continuations)]
        if any(not c for _, c in pairs):
            raise RagsieveError("an empty continuation has no log-probability")
        out = np.zeros(len(pairs), dtype=np.float64)
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))  # less padding
        for lo in range(0, len(order), batch_size):
            idx = order[lo: lo + batch_size]
            batch = self.tokenizer.pad({"input_ids": [pairs[i][0] + pairs[i][1] for i in idx]}, padding=True,
                                       return_tensors="pt").to(self.device)  # on the left (see __init__)
            ids, mask = batch["input_ids"], batch["attention_mask"]
            keep = max(len(pairs[i][1]) for i in idx) + 1  # the vocabulary projection of the answers' positions only
            with torch.inference_mode():  # left padding: positions count from each row's first real token
                logits = self.model(input_ids=ids, attention_mask=mask, logits_to_keep=keep,
                                    position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
            logp = torch.log_softmax(logits.float(), dim=-1)
            for row, i in enumerate(idx):
                cont = pairs[i][1]
                at = torch.arange(keep - len(cont) - 1, keep - 1, device=self.device)
                out[i] = float(logp[row, at, torch.tensor(cont, device=self.device)].mean())
        return out

    # -- generation -----------------------------------------------------------
    def generate(
        self,
        user_messages: Sequence[str],
        *,
        system: str | None = None,
        max_new_tokens: int = 32,
        batch_size: int = 8,
        formatted: bool = False,
    ) -> list[str]:
        """Greedy answers, one per message; ``formatted=True`` skips the chat template."""
        prompts = list(user_messages) if formatted else [self.format_prompt(m, system) for m in user_messages]
        return self._generate(prompts, max_new_tokens, batch_size, capture_layers=None)[0]

    def generate_with_states(
        self,
        user_messages: Sequence[str],
        layer: int,
        *,
        system: str | None = None,
        max_new_tokens: int = 32,
        batch_size: int = 8,
    ) -> tuple[list[str], "np.ndarray"]:
        """Greedy answers plus the pre-token state of hidden layer ``layer`` (1-based).

        The state is read during the prefill that generation runs anyway, so the probe's
        training data costs no extra forward pass. It equals
        :class:`~ragsieve.probe.hidden.HiddenStateExtractor` on the same prompt.
        """
        texts, states = self.generate_with_layer_states(
            user_messages, [layer], system=system, max_new_tokens=max_new_tokens, batch_size=batch_size
        )
        return texts, states[layer]

    def generate_with_layer_states(
        self,
        user_messages: Sequence[str],
        layers: Sequence[int],
        *,
        system: str | None = None,
        max_new_tokens: int = 32,
        batch_size: int = 8,
    ) -> tuple[list[str], "dict[int, np.ndarray]"]:
        """Greedy answers plus the pre-token states of several hidden layers (1-based), one prefill.

        Every layer runs during the prefill anyway, so a layer sweep's states cost only
        the copies of each layer's last position (576 floats per layer for SmolLM2).

        Example::

            texts, by_layer = llm.generate_with_layer_states(["who wrote hamlet?"], range(1, llm.num_layers + 1))
            by_layer[15].shape  # (1, 576)
        """
        prompts = [self.format_prompt(m, system) for m in user_messages]
        texts, states = self._generate(prompts, max_new_tokens, batch_size, capture_layers=sorted(set(layers)))
        return texts, states or {}

    def _generate(
        self, prompts: list[str], max_new_tokens: int, batch_size: int, capture_layers: Sequence[int] | None
    ) -> tuple[list[str], "dict[int, np.ndarray] | None"]:
        import numpy as np
        import torch

        _check_generation(max_new_tokens, batch_size)
        start = time.perf_counter()
        layers = list(capture_layers or [])
        bad = [layer for layer in layers if not 1 <= layer <= self.num_layers]
        if bad:
            raise RagsieveError(f"layer(s) {bad} out of range for a {self.num_layers}-layer model "
                                f"(1..{self.num_layers})")
        states = {layer: np.zeros((len(prompts), self.hidden_size), dtype=np.float32) for layer in layers} or None
        captured: dict[int, "torch.Tensor"] = {}
        handles = []
        if layers:
            from ragsieve.models.layers import decoder_layers, last_position

            def hook_for(layer: int):
                def hook(_module, _inputs, output):
                    if layer not in captured:  # the first call is the prefill over the whole prompt
                        captured[layer] = last_position(output)

                return hook

            blocks = decoder_layers(self.model)
            handles = [blocks[layer - 1].register_forward_hook(hook_for(layer)) for layer in layers]
        # Length-sorted batches waste less compute on padding; results go back in order.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        by_index: dict[int, str] = {}
        try:
            for lo in range(0, len(order), batch_size):
                idx = order[lo : lo + batch_size]
                enc = self.tokenizer(
                    [prompts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False
                ).to(self.device)
                captured.clear()
                with torch.inference_mode():
                    out = self.model.generate(
                        **enc,
                        max_new_tokens=max_new_tokens,
                        do_sample=False,
                        pad_token_id=self.tokenizer.pad_token_id,
                    )
                if states is not None:
                    for layer in layers:
                        states[layer][idx] = captured[layer].numpy()
                new = out[:, enc["input_ids"].shape[1] :]
                for row, i in enumerate(idx):
                    by_index[i] = self.tokenizer.decode(new[row], skip_special_tokens=True).strip()
                    self.stats.new_tokens += int((new[row] != self.tokenizer.pad_token_id).sum())
                report("generate", lo + len(idx), len(order))
        finally:
            for handle in handles:
                handle.remove()
        self.stats.prompts += len(prompts)
        self.stats.seconds += time.perf_counter() - start
        return [by_index[i] for i in range(len(prompts))], states


#: Defaults that give up on a dead or stalled endpoint within 30 s (see ``worst_case_seconds``):
#: 3 tries of at most 8 s each, with 1 s and 2 s pauses between them.
DEFAULT_ENDPOINT_TIMEOUT = 8.0
DEFAULT_ENDPOINT_RETRIES = 2
TIMEOUT_ENV = "RAGSIEVE_LLM_TIMEOUT"
RETRIES_ENV = "RAGSIEVE_LLM_RETRIES"


def endpoint_settings(
    timeout: float | None = None, retries: int | None = None, *, names: tuple[str, str] = ("timeout", "retries")
) -> tuple[float, int]:
    """``(timeout, retries)`` for an endpoint: the arguments, else the environment, else the defaults.

    ``timeout`` is the limit in seconds for one try (connect, send and the whole answer),
    ``retries`` the extra tries after a failed one. Bad values are one-line errors naming
    the argument (``names``, e.g. ``("--timeout", "--retries")`` for the CLI) or the
    environment variable they came from, so a command can check them before loading anything.
    """
    from ragsieve.checks import non_negative_int, positive_number

    timeout_name, timeout = _from_env(timeout, names[0], TIMEOUT_ENV, DEFAULT_ENDPOINT_TIMEOUT)
    retries_name, retries = _from_env(retries, names[1], RETRIES_ENV, DEFAULT_ENDPOINT_RETRIES)
    positive_number(timeout, timeout_name)
    non_negative_int(retries, retries_name)
    return float(timeout), int(retries)


def _from_env(value: Any, name: str, env: str, default: float) -> tuple[str, Any]:
    """``(where it came from, value)``: the argument if given, else ``$env`` parsed as a number, else the default."""
    if value is not None:
        return name, value
    raw = os.environ.get(env, "").strip()
    if not raw:
        return name, default
    for parse in (int, float):
        try:
            return f"${env}", parse(raw)
        except ValueError:
            pass
    return f"${env}", raw  # not a number: the range check names it


class OpenAIChatLLM:
    """Client for an OpenAI-compatible ``/chat/completions`` endpoint.

    ``spec`` is ``openai:<base_url>#<model>``, e.g. ``openai:http://localhost:8000/v1#meta-llama/Meta-Llama-3-8B-Instruct``.
    The API key, if the server needs one, comes from ``OPENAI_API_KEY``. Each try is limited
    to ``timeout`` seconds for the whole answer (a server that accepts the connection and
    never answers, or trickles bytes, is cut off too); failed tries are retried
    ``retries`` times with exponential backoff, logging a warning per retry, and a server
    that stays down raises one clear error. ``timeout`` / ``retries`` default to
    ``$RAGSIEVE_LLM_TIMEOUT`` / ``$RAGSIEVE_LLM_RETRIES``, else to values that give up
    within 30 s.
    """

    def __init__(
        self, spec: str, *, timeout: float | None = None, retries: int | None = None, backoff: float = 1.0
    ):
        parsed = ModelSpec.parse(spec)
        if not parsed.is_endpoint:
            raise ModelNotAvailable(f"'{spec}' is not an openai:<url>#<model> spec")
        self.spec = str(parsed)
        self.base_url = parsed.target
        self.model_name = parsed.model
        self.timeout, self.retries = endpoint_settings(timeout, retries)
        self.backoff = backoff
        self.stats = GenerationStats()
        self._client = None  # one connection pool for every request (made on first use; not pickled)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}  # a client holds sockets: a copy (e.g. on Ray) makes its own

    def _http(self):
        """The client every try goes through: a new ``httpx.Client`` per request cost ≈ 30 ms of TLS set-up and a
        new connection, more than a small endpoint takes to answer (a 150-question endpoint fit spent 87 of its
        109 s answering in it)."""
        import httpx

        if self._client is None:
            self._client = httpx.Client(timeout=httpx.Timeout(self.timeout))
        return self._client

    @property
    def worst_case_seconds(self) -> float:
        """The longest a request can take before it fails: every try times out, plus the pauses."""
        pauses = sum(self.backoff * 2**attempt for attempt in range(self.retries))
        return (self.retries + 1) * self.timeout + pauses

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        import httpx

        headers = {"Content-Type": "application/json"}
        if key := os.environ.get("OPENAI_API_KEY"):
            headers["Authorization"] = f"Bearer {key}"
        url = f"{self.base_url}/chat/completions"
        last_error = ""
        for attempt in range(self.retries + 1):
            try:
                status, body = self._post_once(url, payload, headers)
                if status < 500 and status != 429:
                    if status >= 400:
                        raise RagsieveError(f"{url} answered {status}: {_one_line(body.decode('utf-8', 'replace'))}")
                    return _json_body(url, body)
                last_error = f"HTTP {status}"
            except httpx.HTTPError as exc:
                last_error = f"{type(exc).__name__}: {_one_line(str(exc)) or 'no detail'}"
            except _DeadlineExceeded:
                last_error = f"no complete answer within {self.timeout:g} s"
            if attempt < self.retries:
                pause = self.backoff * 2**attempt
                # a line per retry, so a slow endpoint is visibly being waited for, not hung
                log.warning(
                    "endpoint %s: %s; retry %d of %d in %.1f s", url, last_error, attempt + 1, self.retries, pause
                )
                time.sleep(pause)
        raise RagsieveError(
            f"endpoint {url} unavailable after {self.retries + 1} tries ({last_error}); check the server, "
            f"or allow more time with --timeout / ${TIMEOUT_ENV} and --retries / ${RETRIES_ENV}"
        )

    def _post_once(self, url: str, payload: dict[str, Any], headers: dict[str, str]) -> tuple[int, bytes]:
        """One try: ``(status, body)``, or :class:`_DeadlineExceeded` once ``timeout`` has passed.

        httpx's timeouts bound each network wait, not the whole answer; the deadline check
        between chunks bounds the whole try.
        """
        import httpx

        deadline = time.monotonic() + self.timeout
        chunks = []
        with self._http().stream("POST", url, json=payload, headers=headers) as response:
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise _DeadlineExceeded
        return response.status_code, b"".join(chunks)

    def generate(
        self,
        user_messages: Sequence[str],
        *,
        system: str | None = None,
        max_new_tokens: int = 32,
        batch_size: int = 8,  # requests go one at a time; kept for interface parity
    ) -> list[str]:
        _check_generation(max_new_tokens, batch_size)
        start = time.perf_counter()
        answers = []
        for message in user_messages:
            messages = [{"role": "system", "content": system}] if system else []
            messages.append({"role": "user", "content": message})
            body = self._post(
                {"model": self.model_name, "messages": messages, "max_tokens": max_new_tokens, "temperature": 0.0}
            )
            try:
                answers.append((body["choices"][0]["message"]["content"] or "").strip())
            except (KeyError, IndexError, TypeError):
                raise RagsieveError(f"{self.base_url}: response has no choices[0].message.content") from None
        self.stats.prompts += len(user_messages)
        self.stats.seconds += time.perf_counter() - start
        return answers


def _check_generation(max_new_tokens: int, batch_size: int) -> None:
    """One line instead of transformers' traceback for ``max_new_tokens=0`` (or a zero batch)."""
    from ragsieve.checks import positive_int

    positive_int(max_new_tokens, "max_new_tokens")
    positive_int(batch_size, "batch_size")


class _DeadlineExceeded(Exception):
    """A try of :class:`OpenAIChatLLM` ran past its timeout."""


def _one_line(text: str, limit: int = 200) -> str:
    return " ".join(text.split())[:limit]


def _json_body(url: str, body: bytes) -> dict[str, Any]:
    """The JSON object of a 2xx answer; a proxy's HTML page or a cut answer is one line."""
    import json

    try:
        data = json.loads(body)
    except ValueError:
        start = _one_line(body.decode("utf-8", "replace"))[:80]
        raise RagsieveError(f"{url} answered with something that is not JSON: {start!r}") from None
    if not isinstance(data, dict):
        raise RagsieveError(f"{url} answered with JSON that is not an object")
    return data


# -- loading -------------------------------------------------------------------


def _embedded_cache_dir(name: str) -> Path:
    return cache_dir() / "models" / f"{name}-v{_CACHE_FORMAT}"


@contextlib.contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """transformers parses the GGUF file's header anew for the tokenizer, the config and the weights; in pure
    Python each parse of SmolLM2's 49k-token vocabulary takes ≈ 6 s. Within this block a file is parsed once."""
    import gguf

    original, parsed = gguf.GGUFReader, {}

    def read_once(path: Any, mode: str = "r") -> Any:
        key = (str(path), mode)
        if key not in parsed:
            parsed[key] = original(path, mode)
        return parsed[key]

    gguf.GGUFReader = read_once
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _convert_gguf_to_cache(name: str) -> Path:
    """Dequantise an embedded GGUF once and keep a safetensors copy.

    A file lock serialises concurrent converters; the copy is written to a temp dir
    and renamed into place, so readers never see a half-written cache.
    """
    from filelock import FileLock
    from transformers import AutoModelForCausalLM, AutoTokenizer

    embedded = get_embedded(name, kind="gguf-llm")
    target = _embedded_cache_dir(name)
    if (target / "config.json").exists():
        # a truncated copy (full disk, a damaged backup) would fail deep inside transformers
        check_model_folder(target, cache_rebuild(target) + " (about 20 s)")
        return target
    gguf_path = embedded.path()
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").exists():  # another process finished while we waited
            return target
        log.info("converting %s (first load, ~20 s) into %s", gguf_path.name, target)
        with _gguf_parsed_once():
            tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
            model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        # The weights are now plain fp32; drop the GGUF quantiser so save_pretrained
        # writes ordinary safetensors that load without gguf installed.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        # overwrite: under the lock, a target without config.json is broken, not someone's work
        with atomic_directory(target, overwrite=True) as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
    return target


def chat_prompt(tokenizer: "PreTrainedTokenizerBase", user_message: str, system: str | None = None) -> str:
    """The prompt a local LLM sees: its chat template with the generation prompt, when it has one
    (a tokenizer alone is enough, e.g. to check label words without loading weights)."""
    if not getattr(tokenizer, "chat_template", None):
        return f"{system}\n\n{user_message}\n" if system else f"{user_message}\n"
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": user_message})
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def resolve_llm_path(spec: str) -> str:
    """The local folder or HF id that ``from_pretrained`` should read for ``spec``."""
    parsed = ModelSpec.parse(spec)
    if parsed.is_embedded:
        return str(_convert_gguf_to_cache(parsed.target))
    if not parsed.is_endpoint:
        return parsed.target
    raise ModelNotAvailable(f"'{spec}' is an endpoint, not a local model")


def load_llm(
    spec: str = DEFAULT_LLM,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    timeout: float | None = None,
    retries: int | None = None,
) -> LocalLLM | OpenAIChatLLM:
    """Load a generator from a spec (see :mod:`ragsieve.models.specs`).

    ``timeout`` / ``retries`` apply to endpoints only (see :class:`OpenAIChatLLM`).

    Example::

        llm = load_llm("embedded:smollm2-135m-instruct")
        llm = load_llm("openai:http://localhost:11434/v1#llama3")
    """
    if ModelSpec.parse(spec).is_endpoint:
        return OpenAIChatLLM(spec, timeout=timeout, retries=retries)
    return load_local_llm(spec, device=device, dtype=dtype)


def load_local_llm(spec: str = DEFAULT_LLM, *, device: str = "cpu", dtype: str = "float32") -> LocalLLM:
    """Like :func:`load_llm` but only local models (the probe needs hidden states)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_llm_path(spec)
    if Path(path).is_dir():
        check_model_folder(path, f"re-save or re-download the model in {path}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except OSError as exc:
        raise ModelNotAvailable(
            f"cannot load LLM '{spec}' from {path}: {str(exc).splitlines()[0]} "
            "(no hub access here: give a local folder or an embedded: spec)"
        ) from exc
    return LocalLLM(model.to(device), tokenizer, str(ModelSpec.parse(spec)))
