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


def read_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON file that must hold a mapping."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise RagsieveError(f"config file not found: {path}")
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise RagsieveError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'} ({first})") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise RagsieveError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def load_config(cls: type[C], path: str | Path, overrides: dict[str, Any] | None = None) -> C:
    data = read_mapping(path)
    data.update(overrides or {})
    return build_config(cls, data, source=str(path))
