"""The gate stage: Confidence-Based Dynamic Retrieval (CBDR)."""

from ragsieve.gate.cbdr import (
    CBDRGate,
    GateDecision,
    gate_accuracy,
    gate_table,
    oracle_gate,
    random_gate,
    skip_at_parity,
    skip_at_parity_interval,
    sweep_cbdr,
)

__all__ = [
    "CBDRGate", "GateDecision", "gate_accuracy", "gate_table", "oracle_gate", "random_gate", "skip_at_parity",
    "skip_at_parity_interval", "sweep_cbdr",
]
