"""Shared fixtures: tiny random models of the real architectures, and the real ones.

Unit tests use the tiny models (seconds); tests marked ``integration`` load the real
embedded SmolLM2 / MiniLM weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RAGSIEVE_DATA") or REPO.parent / "shared" / "data")

# ChatML, the template family SmolLM2 uses, so tiny models format prompts the same way.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

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
