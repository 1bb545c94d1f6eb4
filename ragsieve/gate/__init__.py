"""The gate stage: Confidence-Based Dynamic Retrieval (CBDR)."""

from ragsieve.gate.cbdr import CBDRGate, GateDecision, gate_accuracy, skip_at_parity, sweep_cbdr

__all__ = ["CBDRGate", "GateDecision", "gate_accuracy", "skip_at_parity", "sweep_cbdr"]
