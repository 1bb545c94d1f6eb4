"""``ragsieve fit``: build a sieve for your LLM from your corpus (an index) and your questions.

Example::

    from ragsieve.fit import FitConfig, fit_sieve
    fit_sieve(FitConfig(index="index/mine", questions="qa.jsonl", llm="hf:Qwen/Qwen2.5-7B-Instruct", out="sieves/qwen"))
"""

from ragsieve.fit.config import AlignConfig, FitConfig, SelectConfig, gate_budget, token_budget
from ragsieve.fit.run import PHASES, Fit, fit_sieve

__all__ = ["PHASES", "AlignConfig", "Fit", "FitConfig", "SelectConfig", "fit_sieve", "gate_budget", "token_budget"]
