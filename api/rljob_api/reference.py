"""Generate the field reference (docs/reference.md) from the pydantic models."""

from __future__ import annotations

import json
import types
import typing
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from .presets import PAPERS, PRESET_PAPER, PRESETS, SETTINGS
from .spec import RLJobSpec
from .status import RLJobStatus

HEADER = "<!-- Generated from rljob_api by `rljob generate`. DO NOT EDIT. -->\n"
ALGORITHM = "spec.algorithm"
PER_PRESET = "[per preset](#algorithm-presets)"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _type_name(annotation: Any) -> str:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        names = [_type_name(a) for a in get_args(annotation) if a is not type(None)]
        return " \\| ".join(names)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in get_args(annotation))
    if origin is list:
        return f"list of {_type_name(get_args(annotation)[0])}"
    if origin is dict:
        return f"map of {_type_name(get_args(annotation)[1])}"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "object"
    return getattr(annotation, "__name__", str(annotation))


def _default(info: FieldInfo) -> str:
    if info.is_required():
        return "**required**"
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
        if isinstance(value, BaseModel):
            return "see below"
        return f"`{json.dumps(value)}`"
    if info.default is None or info.default is PydanticUndefined:
        return ""
    return f"`{json.dumps(info.default)}`"


def _section(model: type[BaseModel], path: str, out: list[str]) -> None:
    out.append(f"\n### `{path}`\n\n{(model.__doc__ or '').strip()}\n")
    out.append("| field | type | default | description |\n|---|---|---|---|")
    nested: list[tuple[type[BaseModel], str]] = []
    for name, info in model.model_fields.items():
        alias = info.alias or name
        default = PER_PRESET if _preset_setting(f"{path}.{alias}") else _default(info)
        out.append(f"| `{alias}` | {_type_name(info.annotation)} | {default} | {info.description or ''} |")
        for sub in _models_in(info.annotation):
            suffix = "[]" if get_origin(info.annotation) is list else ""
            nested.append((sub, f"{path}.{alias}{suffix}"))
    for sub, sub_path in nested:
        _section(sub, sub_path, out)


def _preset_setting(path: str) -> bool:
    return path.startswith(ALGORITHM + ".") and path.removeprefix(ALGORITHM + ".") in SETTINGS


def _cell(value: Any) -> str:
    return f"`{json.dumps(value)}`" if not hasattr(value, "of") else str(value)


def presets_markdown() -> list[str]:
    """The table of every preset-decided setting's default under each preset, and where it comes from."""
    out = [
        "\n## Algorithm presets\n",
        f"`{ALGORITHM}.name` picks a preset; each setting the job leaves unset takes the preset's default "
        "below (what `rljob validate` prints as the algorithm the job runs). `grpo` is rljob's behaviour "
        "before presets existed: token-mean, as DAPO, and no KL.\n",
        "| setting | " + " | ".join(f"`{p}`" for p in PRESETS) + " | from |",
        "|---|" + "---|" * len(PRESETS) + "---|",
    ]
    for path, setting in SETTINGS.items():
        cells = " | ".join(_cell(setting.defaults[p]) for p in PRESETS)
        out.append(f"| `{path}` | {cells} | {setting.source} |")
    out.append("\nPapers:\n")
    out.extend(f"- {name}: {PAPERS[name]}" for name in PAPERS)
    named = ", ".join(f"`{p}`: {PRESET_PAPER[p]}" for p in PRESETS)
    out.append(f"\nPresets by paper: {named}.")
    return out


def reference_markdown() -> str:
    """The whole field reference of RLJob spec and status."""
    out = [
        HEADER,
        "# RLJob field reference\n",
        "`apiVersion: rljob.io/v1alpha1`, `kind: RLJob`, short name `rlj`. Every field, its "
        "default and its meaning, generated from the schema in `api/rljob_api`.",
        "\n## Spec",
    ]
    _section(RLJobSpec, "spec", out)
    out.extend(presets_markdown())
    out.append("\n## Status")
    _section(RLJobStatus, "status", out)
    return "\n".join(out) + "\n"
