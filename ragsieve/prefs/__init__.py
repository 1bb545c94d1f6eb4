"""Confidence-shift preference sets (Inc = Conf(Q+C) − Conf(Q)) for aligning rerankers."""

from ragsieve.prefs.preferences import (
    PreferenceRecord,
    confidence_shift,
    read_preferences,
    select_preferences,
    write_preferences,
)

__all__ = ["PreferenceRecord", "confidence_shift", "read_preferences", "select_preferences", "write_preferences"]
