"""What a measurement records about the machine it ran on: one shape for every bench/*.py result."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(**extra) -> dict:
    """CPU count and model, platform, Python and the load average now (call it at the end of a run: a loaded
    machine explains a slow number), plus ``extra``."""
    return {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "platform": platform.platform(),
            "python": platform.python_version(), "loadavg": [round(x, 2) for x in os.getloadavg()], **extra}
