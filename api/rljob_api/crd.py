"""Generate the RLJob CustomResourceDefinition from the pydantic models (the only source)."""

from __future__ import annotations

from typing import Any

import yaml

from .spec import API_VERSION, GROUP, KIND, PLURAL, SHORT_NAMES, VERSION, RLJobSpec
from .status import RLJobStatus

CRD_NAME = f"{PLURAL}.{GROUP}"
HEADER = "# Generated from rljob_api by `rljob generate`. DO NOT EDIT.\n"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
    {"name": "Version", "type": "integer", "jsonPath": ".status.policyVersion", "priority": 1},
    {"name": "Reward", "type": "number", "jsonPath": ".status.reward.mean"},
    {"name": "Eval-Reward", "type": "number", "jsonPath": ".status.eval.rewardMean", "priority": 1},
    {"name": "Staleness", "type": "number", "jsonPath": ".status.staleness.mean", "priority": 1},
    {"name": "Reward-Replicas", "type": "integer", "jsonPath": ".status.pools.reward.ready"},
    {"name": "Env-Replicas", "type": "integer", "jsonPath": ".status.pools.environment.ready", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# JSON-schema keywords the Kubernetes structural schema accepts as they are.
_KEPT = {
    "type",
    "description",
    "enum",
    "default",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "pattern",
    "format",
    "x-kubernetes-validations",
}


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    target = dict(defs[ref.rsplit("/", 1)[-1]])
    target.update({k: v for k, v in schema.items() if k != "$ref"})
    return target


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Turn one pydantic JSON-schema node into a structural OpenAPI v3 node: no $ref, no anyOf."""
    schema = _resolve(schema, defs)
    variants = schema.get("anyOf")
    if variants:
        types = [_resolve(v, defs) for v in variants]
        non_null = [v for v in types if v.get("type") != "null"]
        base = {k: v for k, v in schema.items() if k != "anyOf"}
        if {v.get("type") for v in non_null} == {"string", "integer"}:
            node: dict[str, Any] = {"x-kubernetes-int-or-string": True}
            node.update({k: v for k, v in base.items() if k in _KEPT})
        elif len(non_null) == 1:
            node = structural({**non_null[0], **base}, defs)
        else:
            raise ValueError(f"cannot express union {variants} as a structural schema")
        if len(non_null) < len(types):
            node["nullable"] = True
            if node.get("default") is None:
                node.pop("default", None)
        return node
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _KEPT:
            out[key] = value
        elif key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out.update(minimum=value, exclusiveMinimum=True)
        elif key == "exclusiveMaximum":
            out.update(maximum=value, exclusiveMaximum=True)
    if schema.get("type") == "object" or "properties" in schema:
        out["type"] = "object"
        required = set(schema.get("required", []))
        props = {}
        for name, prop in schema.get("properties", {}).items():
            node = structural(prop, defs)
            # An omitted nested object defaults to all of its fields' defaults, spelled out: the API
            # server checks a default against the CEL rules as it is, without defaulting inside it.
            if name not in required and "default" not in node and _all_optional(node):
                node["default"] = {k: v["default"] for k, v in node["properties"].items() if "default" in v}
            props[name] = node
        if props:
            out["properties"] = props
        if required:
            out["required"] = sorted(required)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            out["additionalProperties"] = structural(extra, defs)
        elif extra is True:  # free-form (an environment's args): kept as written, not pruned
            out["x-kubernetes-preserve-unknown-fields"] = True
    if schema.get("type") == "array":
        out["items"] = structural(schema.get("items", {}), defs)
    return out


def _all_optional(node: dict[str, Any]) -> bool:
    return (
        node.get("type") == "object" and "properties" in node and not node.get("required") and not node.get("nullable")
    )


def _model_schema(model: type[Any]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}))


def openapi_schema() -> dict[str, Any]:
    """The openAPIV3Schema of the RLJob version."""
    return {
        "type": "object",
        "description": "An RL post-training job: rollout, trainer and reward pools on a Ray cluster.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": _model_schema(RLJobSpec),
            "status": _model_schema(RLJobStatus),
        },
    }


def crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": SHORT_NAMES,
                "categories": ["rljob"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                    "schema": {"openAPIV3Schema": openapi_schema()},
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML file committed under crds/ and the chart."""
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=100, allow_unicode=True)


__all__ = ["API_VERSION", "CRD_NAME", "crd", "crd_yaml", "openapi_schema"]
