"""What this CPU and process run fast: bf16 matrix units decide whether a bf16 backend pays, and jemalloc
rules OpenVINO out."""

from __future__ import annotations

import contextlib
import logging
import os
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def fast_bf16() -> bool:
    """True when the CPU has native bf16 matrix instructions (Intel AMX or AVX512-BF16), where torch's bf16
    autocast runs a MiniLM-size model ≈ 2.5-3× faster than fp32; elsewhere bf16 is emulated and slower.

    ``RAGSIEVE_CPU_BF16=0`` answers False on any CPU (the fp32 / int8 backends a CPU without bf16 units loads:
    bit-for-bit runs across machines, or a virtual CPU whose flags promise more than it runs); ``=1`` answers True.
    """
    forced = os.environ.get("RAGSIEVE_CPU_BF16", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


@lru_cache(maxsize=1)
def jemalloc_loaded() -> bool:
    """True when jemalloc is mapped into this process (``LD_PRELOAD``, as the README suggests for long trainings):
    OpenVINO's CPU plugin then aborts the process when it compiles a model (``free(): invalid pointer``)."""
    try:
        return "jemalloc" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def cpu_backend(backend: str) -> str:
    """``backend`` as this process can run it: ``torch-bf16`` for an OpenVINO backend beside jemalloc, and
    ``torch`` for ``torch-bf16`` on a CPU without native bf16 (one log line says which)."""
    if backend.startswith("openvino") and jemalloc_loaded():
        log.info("%s cannot run beside jemalloc (LD_PRELOAD): running torch-bf16", backend)
        backend = "torch-bf16"
    if backend == "torch-bf16" and not fast_bf16():
        log.info("torch-bf16 needs a CPU with AMX or AVX512-BF16; running torch (fp32)")
        return "torch"
    return backend


def autocast(backend: str):
    """The context a backend's torch forward runs in: bf16 autocast for ``torch-bf16``, else nothing."""
    if backend != "torch-bf16":
        return contextlib.nullcontext()
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16)
