"""Parse RLJob YAML into the model, with errors that name the field and the rule."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .base import FieldError, FieldRuleError, RLJobInvalid
from .peers import peer_hint
from .spec import RLJob

_PREFIXES = ("Value error, ", "Assertion failed, ")
_UNION_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def field_path(loc: Sequence[int | str]) -> str:
    """('spec', 'reward', 'functions', 0, 'rule') -> 'spec.reward.functions[0].rule'."""
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif part.startswith("["):
            path += part
        else:
            path += f".{part}" if path else part
    return path


def _message(error: dict[str, Any]) -> tuple[str, str]:
    """(extra path, message) of one pydantic error, in words a user can act on."""
    kind = error["type"]
    cause = (error.get("ctx") or {}).get("error")
    if isinstance(cause, FieldRuleError):
        return cause.field, cause.message
    if kind == "extra_forbidden":
        return "", "unknown field (check its spelling and indentation)" + peer_hint(str(error["loc"][-1]))
    if kind == "missing":
        return "", "required field is missing"
    if kind == "string_pattern_mismatch":
        return "", f"{error['input']!r} does not match {error['ctx']['pattern']}"
    if kind == "literal_error":
        return "", f"{error['input']!r} is not one of {error['ctx']['expected']}"
    message = str(error["msg"])
    for prefix in _PREFIXES:
        message = message.removeprefix(prefix)
    return "", message


def _is_union_tag(part: int | str) -> bool:
    """Pydantic names union members in the loc ('str', 'int'); users never wrote those."""
    return isinstance(part, str) and (part in _UNION_TAGS or "[" in part)


def errors_of(exc: ValidationError) -> list[FieldError]:
    """Every error of a ValidationError, with the field named by its camelCase path.

    The alternatives of a union that all failed become one error for the field.
    """
    messages: dict[str, list[str]] = {}
    for error in exc.errors():
        loc = [p for p in error["loc"] if not _is_union_tag(p)]
        extra, message = _message(dict(error))
        path = field_path(loc)
        if extra:
            path = field_path([path, extra]) if path else extra
        messages.setdefault(path, []).append(message)
    return [
        FieldError(
            path,
            found[0] if len(found) == 1 else "none of the allowed forms fits: " + "; ".join(found),
        )
        for path, found in messages.items()
    ]


def parse_rljob(document: Any, source: str = "") -> RLJob:
    """Validate one parsed YAML/JSON document as an RLJob, or raise RLJobInvalid."""
    if not isinstance(document, dict):
        raise RLJobInvalid([FieldError("", "expected a mapping with apiVersion, kind, metadata, spec")], source)
    try:
        return RLJob.model_validate(document)
    except ValidationError as exc:
        raise RLJobInvalid(errors_of(exc), source) from None


def load_rljob(path: str | Path) -> RLJob:
    """Read and validate an RLJob YAML file (one document)."""
    text = Path(path).read_text()
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise RLJobInvalid([FieldError("", f"not valid YAML: {exc}")], str(path)) from None
    if len(documents) != 1:
        raise RLJobInvalid([FieldError("", f"expected one YAML document, found {len(documents)}")], str(path))
    return parse_rljob(documents[0], str(path))
