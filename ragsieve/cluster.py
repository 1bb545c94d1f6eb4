"""The one place ragsieve connects to Ray (``fit --ray``, ``index --ray``, ``serve --ray``), and what a Ray actor
of one CPU sets up before it loads a model."""

from __future__ import annotations

import logging
import os
from typing import Any

from ragsieve.errors import RagsieveError


def init_ray(address: str, num_cpus: int | None = None) -> None:
    """Connect to ``address`` (``ray://...`` or ``host:port``) or start a local instance (``local``)."""
    try:
        import ray
    except ImportError as exc:
        raise RagsieveError("--ray needs Ray Data: pip install 'ragsieve[ray]'") from exc
    if ray.is_initialized():
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "configure_logging": False}
    if address == "local":
        # Serve's HTTP proxy must say it is ready within 5 s, 3 times over, or it is killed and started
        # again; on a busy 2-core machine its start alone took > 20 s and Serve looped. The local
        # instance's processes inherit this environment.
        os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "60")
        ray.init(num_cpus=num_cpus, **kwargs)
    else:
        ray.init(address=address, **kwargs)
    ray.data.DataContext.get_current().enable_progress_bars = False  # the callers draw their own per phase
    logging.getLogger("ray.data").setLevel(logging.WARNING)


def cluster_cpus() -> int:
    """CPUs of the connected Ray cluster: one single-threaded actor each."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def set_actor_threads(threads: int) -> None:
    """torch's threads in an actor of ``threads`` CPUs: one actor per CPU, no oversubscription."""
    import torch

    torch.set_num_threads(max(1, threads))
