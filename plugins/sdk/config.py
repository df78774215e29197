"""Plugin configuration files: YAML read and pydantic-validated, errors naming file and fields."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

__all__ = [
    "Explain",
    "Place",
    "field_path",
    "place_problem",
    "read_yaml",
    "validate_model",
    "validation_problems",
]

ModelT = TypeVar("ModelT", bound=BaseModel)

Explain = Callable[[ErrorDetails, str], str]
"""A plugin's wording for one pydantic error: (error, default message) → message."""

Place = Callable[[str, str], str]
"""Joins a field path ("" at the top level) and a message into one problem."""

_FIELD_PREFIX = re.compile(r"^[A-Za-z][\w.\[\]]*: ")


def field_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location as a field path: clusters[0].nodePools ("" at the top level)."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def place_problem(where: str, message: str) -> str:
    """where: message; a message naming a sub-field ("x: ...") is appended as where.x: ...

    Top-level (cross-field) messages name their own fields and stand alone.
    """
    if not where:
        return message
    if _FIELD_PREFIX.match(message):
        return f"{where}.{message}"
    return f"{where}: {message}"


def _message(error: ErrorDetails) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown field; remove it or check its spelling"
    return str(error["msg"]).removeprefix("Value error, ")


def validation_problems(
    exc: ValidationError, explain: Explain | None = None, place: Place = place_problem
) -> list[str]:
    """One "path: problem" per error; unknown fields are told to be removed or respelled."""
    problems = []
    for error in exc.errors(include_url=False):
        message = _message(error)
        if explain is not None:
            message = explain(error, message)
        problems.append(place(field_path(tuple(error["loc"])), message))
    return problems


def validate_model(
    model: type[ModelT],
    data: object,
    source: str,
    error: Callable[[str], Exception],
    *,
    not_mapping: str,
    explain: Explain | None = None,
    place: Place = place_problem,
) -> ModelT:
    """data (parsed YAML) validated as model; error("<source>: <problems>") when it is not.

    not_mapping: what to say when data is not a mapping (what the top level must hold).
    """
    if not isinstance(data, Mapping):
        raise error(f"{source}: {not_mapping}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(f"{source}: " + "; ".join(validation_problems(exc, explain, place))) from None


def read_yaml(path: str | Path, flag: str, error: Callable[[str], Exception]) -> Any:
    """The parsed YAML at path; error(...) naming the flag (unreadable) or the file (bad YAML)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{flag}: cannot read {str(path)!r} ({exc.strerror})") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML ({exc})") from None
