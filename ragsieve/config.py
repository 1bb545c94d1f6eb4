"""Typed configs: pydantic models that refuse unknown keys, loaded from YAML/JSON.

Every experiment and CLI job is one of these, so a typo in a config key fails at once
with a one-line message instead of silently running the defaults.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from ragsieve.errors import RagsieveError

C = TypeVar("C", bound="StrictConfig")


class StrictConfig(BaseModel):
    """Base for all configs: unknown keys are errors, values are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=())


def format_validation_error(exc: ValidationError, source: str) -> str:
    """Squeeze pydantic's multi-line report into one line naming each bad key."""
    parts = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            parts.append(f"unknown key '{key}'")
        else:
            parts.append(f"'{key}': {err['msg']}")
    return f"{source}: " + "; ".join(parts)


def build_config(cls: type[C], data: dict[str, Any], source: str = "config") -> C:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        raise RagsieveError(format_validation_error(exc, source)) from None


def read_mapping(path: str | Path, what: str = "config") -> dict[str, Any]:
    """Read a YAML or JSON file that must hold a mapping (UTF-8, see :mod:`ragsieve.text_input`).

    ``what`` names the file's role in error messages ("config", "prompt", ...).
    """
    import yaml

    from ragsieve.text_input import read_text

    path = Path(path)
    text = read_text(path, what)
    kind = "JSON" if path.suffix == ".json" else "YAML"
    try:
        data = json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    # ValueError / OverflowError: PyYAML builds dates and numbers that look valid but are not
    # (``2001-13-45``); RecursionError: deeply nested input
    except (json.JSONDecodeError, yaml.YAMLError, ValueError, OverflowError, RecursionError) as exc:
        raise RagsieveError(f"{path}: not valid {kind} ({_first_line(exc)})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RagsieveError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def _first_line(exc: Exception) -> str:
    """The first non-blank line of a parser's (often multi-line) message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def load_config(cls: type[C], path: str | Path, overrides: dict[str, Any] | None = None) -> C:
    data = read_mapping(path)
    data.update(overrides or {})
    return build_config(cls, data, source=str(path))
