"""The base model every RLJob schema class derives from, and the error types of a job that must not run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

IMMUTABLE = "is immutable while the job exists; delete and re-create the RLJob to change it"


class Model(BaseModel):
    """Strict, camelCase-on-the-wire model: unknown fields are errors, never dropped."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_default=True,
        frozen=False,
    )

    def to_wire(self) -> dict[str, Any]:
        """The object as it appears in YAML/JSON: camelCase keys, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class FieldRuleError(ValueError):
    """A cross-field rule broken inside a model, naming the field (relative path) it concerns.

    Validators raise it so that the error printed to the user names the exact field,
    e.g. ``spec.reward.replicas: min 4 is greater than max 2``.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def cel(rule: str, message: str) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry: a rule the API server checks itself."""
    return {"rule": rule, "message": message}


def cel_rules(*rules: dict[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` carrying CEL rules, so each rule sits beside its pydantic twin."""
    return {"x-kubernetes-validations": list(rules)}


@dataclass(frozen=True)
class FieldError:
    """One broken rule: the dotted path of the field and what is wrong with it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class RLJobInvalid(ValueError):
    """An RLJob that must not run; str() lists every broken rule, one per line."""

    def __init__(self, errors: Sequence[FieldError], source: str = "") -> None:
        self.errors = list(errors)
        self.source = source
        head = f"{source}: invalid RLJob" if source else "invalid RLJob"
        super().__init__("\n".join([head, *(f"  {e}" for e in self.errors)]))
