"""Shared fixtures: tiny random models of the real architectures, and the real ones.

Unit tests use the tiny models (seconds); tests marked ``integration`` load the real
embedded SmolLM2 / MiniLM weights.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core: one torch thread each
    os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RAGSIEVE_DATA") or REPO.parent / "shared" / "data")

# ChatML, the template family SmolLM2 uses, so tiny models format prompts the same way.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Test tiers: `make test-fast` runs what is not `slow`; `make test` (CI) runs everything. One place decides
# what is slow — tests that start PostgreSQL or Ray, run a whole fit or a study end to end — so a new test of
# that kind is slow without anyone remembering a marker.
SLOW_FIXTURES = {"postgres", "pg"}
SLOW_FILES = {"test_fit.py", "test_fit_hotpotqa.py", "test_fit_ray.py", "test_serve_ray.py", "test_experiments.py",
              "test_pgvector.py", "test_feedback_store.py", "test_index_ray.py"}


# tests elsewhere that run a study or a whole fit end to end, resume a killed training, or load the real default
# on every backend (≥ 10 s each on 2 cores; `pytest --durations=40` finds new ones)
SLOW_TESTS = {
    "test_experiment_smoke_config_on_tiny_model_resumes_per_cell", "test_the_default_reranker_scores_a_pair_the_same_in_any_batch",
    "test_m0_sweep_scores_every_epoch_on_a_dev_set_chooses_and_skips_what_is_done", "test_eval_retrieval_small",
    "test_gguf_cache_concurrent_conversion", "test_train_cross_encoder_resumes_after_kill",
    "test_fit_and_index_print_progress_lines_to_a_log",
    "test_racing_drops_what_something_cheaper_beats_and_keeps_the_choice_and_the_frontier",
    "test_distill_study_trains_evaluates_and_ships_a_student", "test_endpoint_only_fit_with_smollm2_on_loopback",
    "test_guard_study_end_to_end_tiny_and_resumes", "test_experiment_end_to_end_and_resumable_per_config",
    "test_shipped_default_on_a_cpu_without_bf16_runs_its_fallback_backends",
    "test_a_killed_cell_resumes_after_its_last_checkpointed_round",
}


# `make test` runs the suite on one pytest-xdist worker per core (`--dist loadgroup`): every test starts its
# servers and databases on free ports in temporary folders, so any two run side by side, except two local Ray
# instances, which would each claim both cores: the Ray tests share one worker.
RAY_FILES = {"test_fit_ray.py", "test_serve_ray.py", "test_index_ray.py"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = getattr(item, "originalname", None) or item.name
        if (item.path.name in SLOW_FILES or name in SLOW_TESTS
                or SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))):
            item.add_marker(pytest.mark.slow)
        if item.path.name in RAY_FILES:
            item.add_marker(pytest.mark.xdist_group("ray"))
    # the slow tier first (stable otherwise): the workers start on the long tests and fill in with short ones, so
    # the suite does not end on one long test while the other core idles
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


requires_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason=f"benchmark data not found at {SHARED_DATA}")


def build_tiny_tokenizer(path: Path):
    """A byte-level BPE tokenizer trained on a few sentences (fast, no downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "the quick brown fox jumps over the lazy dog",
        "question answer document passage retrieval relevant true false yes no",
        "Paris is the capital of France. Who wrote Hamlet? William Shakespeare.",
    ] * 20
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(path)
    return fast


@pytest.fixture(scope="session")
def tiny_llm_dir(tmp_path_factory) -> Path:
    """A randomly initialised Llama-architecture causal LM (SmolLM2's family), saved to disk."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    tok = build_tiny_tokenizer(path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llm(tiny_llm_dir):
    from ragsieve.models import load_local_llm

    return load_local_llm(str(tiny_llm_dir))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The embedded SmolLM2's converted folder (tokenizer + safetensors), built from its GGUF on first use (≈ 20 s)."""
    from ragsieve.models.llm import resolve_llm_path
    from ragsieve.models.specs import DEFAULT_LLM

    return Path(resolve_llm_path(DEFAULT_LLM))


@pytest.fixture(scope="session")
def smollm2():
    """The real embedded SmolLM2-135M-Instruct (converted from GGUF once per cache)."""
    from ragsieve.models import load_local_llm

    return load_local_llm()


@pytest.fixture(scope="session")
def minilm():
    from ragsieve.models import load_encoder

    return load_encoder()


@pytest.fixture(scope="session")
def tiny_cross_encoder_dir(tmp_path_factory):
    """A randomly initialised BERT sequence classifier (1 logit) with MiniLM's vocabulary."""
    import shutil

    import torch
    from transformers import BertConfig, BertForSequenceClassification

    from ragsieve.models import get_embedded

    src = get_embedded("all-minilm-l6-v2").path()
    path = tmp_path_factory.mktemp("tiny-ce")
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(src / name, path / name)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(path)
    return path


class LoopbackChatServer:
    """A real OpenAI-compatible ``/v1/chat/completions`` endpoint on 127.0.0.1 (not a mock).

    ``reply(body) -> str`` makes each answer. ``fail_next = n`` answers the next n requests
    with 503; ``answer_limit = n`` answers n more and then stays down (None = always up).
    ``messages`` are the last user messages of the answered requests, in order.
    """

    def __init__(self, reply):
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.reply, self.calls, self.fail_next, self.answer_limit = reply, [], 0, None
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server API)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if owner.fail_next > 0 or owner.answer_limit == 0:
                    owner.fail_next = max(owner.fail_next - 1, 0)
                    self.send_response(503)
                    self.end_headers()
                    return
                if owner.answer_limit is not None:
                    owner.answer_limit -= 1
                owner.calls.append(body)
                message = {"role": "assistant", "content": owner.reply(body)}
                data = json.dumps({"choices": [{"message": message}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    @property
    def messages(self) -> list[str]:
        return [c["messages"][-1]["content"] for c in self.calls]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat_server_factory():
    """``make(reply)`` starts a :class:`LoopbackChatServer`; all are shut down after the test."""
    servers = []

    def make(reply) -> LoopbackChatServer:
        servers.append(LoopbackChatServer(reply))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


@dataclass
class CliResult:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(capsys):
    """``cli("grade", "q", ...)`` runs ``ragsieve ...`` in-process through the real entry point.

    The one way CLI tests call the command line: exit code, stdout and stderr as a user sees them.
    """
    from ragsieve.cli import main

    def run(*args) -> CliResult:
        capsys.readouterr()  # drop what the test printed before
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture(scope="session")
def postgres():
    """A real PostgreSQL server for the session (tools/postgres.py), stopped afterwards; skipped only
    where its binaries are absent."""
    from tools.postgres import PostgresServer, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    with PostgresServer() as server:
        yield server
