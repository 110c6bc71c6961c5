"""A data row's field values on the wire, with their JSON types: the driver writes them as
google.protobuf.Value (beside their text, for servers that read only text), the reward and environment pools
read them back. Names are those functions take them by: a dotted spec.data.fields name by its last part.

JSON has one kind of number, and so has protobuf's Value (a double): an integral number comes back an int, as
a JSON parser in another language would read it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from google.protobuf import json_format, struct_pb2


def short_name(field: str) -> str:
    """What a function takes a field by: `reward_model.ground_truth` -> `ground_truth`."""
    return field.rsplit(".", 1)[-1]


def json_safe(value: Any) -> Any:
    """`value` as JSON types: objects and lists all the way down; a value of no JSON type (a date, bytes, a
    decimal a parquet column may hold) as its text; a non-finite float as its text too (JSON has none)."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if hasattr(value, "item"):  # a numpy scalar
        return json_safe(value.item())
    return str(value)


def as_text(value: Any) -> str:
    """A field's text: a string as it is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(json_safe(value))


def to_values(fields: Mapping[str, Any]) -> dict[str, struct_pb2.Value]:
    """Each field (by its short name) as a protobuf Value."""
    out = {}
    for name, value in fields.items():
        message = struct_pb2.Value()
        json_format.ParseDict(json_safe(value), message)
        out[short_name(name)] = message
    return out


def task_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """An episode's task: each field by its short name, as JSON types (a Struct takes them as they are)."""
    return {short_name(name): json_safe(value) for name, value in fields.items()}


def to_texts(fields: Mapping[str, Any]) -> dict[str, str]:
    """Each field (by its short name) as text."""
    return {short_name(name): as_text(value) for name, value in fields.items()}


def from_value(value: struct_pb2.Value) -> Any:
    """A Value back as Python: dicts, lists, str, bool, None, and numbers (int where integral)."""
    return _ints(json_format.MessageToDict(value))


def from_struct(struct: struct_pb2.Struct) -> dict[str, Any]:
    """A Struct (an episode's task) back as Python, numbers as `from_value` gives them."""
    converted: dict[str, Any] = _ints(json_format.MessageToDict(struct))
    return converted


def sample_fields(values: Mapping[str, struct_pb2.Value], texts: Mapping[str, str]) -> dict[str, Any]:
    """A reward sample's fields as functions take them: the typed values, or (from a sender that writes only
    text) the text."""
    return {name: from_value(value) for name, value in values.items()} if values else dict(texts)


def _ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value
