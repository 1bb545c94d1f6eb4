"""Sentence pruning: the sieve's last step, cutting each kept passage to the sentences the query needs."""

from ragsieve.prune.pruner import PrunedPassage, PruneLayout, SentencePruner
from ragsieve.prune.sentences import split_sentences

__all__ = ["PrunedPassage", "PruneLayout", "SentencePruner", "split_sentences"]
