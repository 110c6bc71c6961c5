"""Generated files equal what their generators produce, and the CRD is a valid structural schema."""

from __future__ import annotations

import copy
import filecmp
import re
import subprocess
import sys
from typing import Any

from rljob_api import parse_rljob
from rljob_api.crd import crd, openapi_schema
from rljob_api.generate import generated_files

from conftest import REPO


def test_generated_schema_files_are_fresh():
    stale = [
        path
        for path, content in generated_files().items()
        if not (REPO / path).exists() or (REPO / path).read_text() != content
    ]
    assert not stale, f"stale generated files {stale}: run `make generate`"


def test_generated_stubs_are_fresh(tmp_path):
    subprocess.run(
        [sys.executable, str(REPO / "proto" / "generate.py"), "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    committed = REPO / "proto" / "gen" / "rljob"
    fresh = tmp_path / "rljob"
    names = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    assert names == sorted(
        p.relative_to(committed) for p in committed.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    differ = [str(n) for n in names if not filecmp.cmp(fresh / n, committed / n, shallow=False)]
    assert not differ, f"stale stubs {differ}: run `make generate`"


def _walk(node: Any, path: str = ""):
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            if key not in ("default", "x-kubernetes-validations", "enum"):
                yield from _walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, f"{path}[{i}]")


def test_crd_schema_is_structural():
    schema = openapi_schema()
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "$defs" not in node, path
        assert "title" not in node or path.endswith("/properties"), path
        if path.endswith("/properties"):
            continue
        if "properties" in node or "items" in node:
            assert node.get("type") in ("object", "array"), path
        if node is not schema:
            assert "type" in node or node.get("x-kubernetes-int-or-string"), f"{path} has no type"


def test_crd_names_columns_and_status_subresource():
    spec = crd()["spec"]
    assert spec["names"]["shortNames"] == ["rlj"]
    version = spec["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase"
    assert columns["Reward-Replicas"] == ".status.pools.reward.ready"


def test_crd_carries_cel_rules_beside_pydantic_validators():
    spec = openapi_schema()["properties"]["spec"]
    replicas = spec["properties"]["reward"]["properties"]["replicas"]
    assert replicas["x-kubernetes-validations"][0]["rule"] == "self.min <= self.max"
    assert {"rule": "self == oldSelf"}.items() <= spec["properties"]["model"]["x-kubernetes-validations"][0].items()


def _apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """What the API server's structural defaulting does to an object (objects only)."""
    if not isinstance(value, dict) or schema.get("type") != "object":
        if isinstance(value, list) and "items" in schema:
            return [_apply_defaults(schema["items"], v) for v in value]
        return value
    out = dict(value)
    for name, prop in schema.get("properties", {}).items():
        if name not in out and "default" in prop:
            out[name] = copy.deepcopy(prop["default"])
        if name in out:
            out[name] = _apply_defaults(prop, out[name])
    return out


def test_api_server_defaults_equal_pydantic_defaults(example_doc):
    """One source of defaults: what the CRD fills in is what pydantic would have."""
    minimal = {
        "apiVersion": "rljob.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "m"},
        "spec": {
            "model": {"path": "/m"},
            "data": {"path": "/d.jsonl"},
            "reward": {"functions": [{"name": "r", "kind": "rule", "rule": {"function": "a:b"}}]},
        },
    }
    for doc in (minimal, example_doc):
        spec_schema = openapi_schema()["properties"]["spec"]
        defaulted = dict(doc, spec=_apply_defaults(spec_schema, doc["spec"]))
        assert parse_rljob(defaulted) == parse_rljob(doc)
        # And the server-defaulted object carries every pydantic default explicitly.
        assert (
            defaulted["spec"]["rollout"]["sampling"]["maxNewTokens"]
            == parse_rljob(doc).spec.rollout.sampling.max_new_tokens
        )


def _rule_keys(rule: str) -> set[str]:
    """Keys of `self` a CEL rule reads without guarding them with has()."""
    read = set(re.findall(r"\bself\.(\w+)", rule))
    return read - set(re.findall(r"\bhas\(self\.(\w+)\)", rule))


def _defaults_missing_rule_keys(schema: dict[str, Any], path: str) -> list[str]:
    problems = []
    default = schema.get("default")
    if isinstance(default, dict):
        for validation in schema.get("x-kubernetes-validations", []):
            missing = _rule_keys(validation["rule"]) - set(default)
            problems += [f"{path}.default lacks {key!r}, read by {validation['rule']!r}" for key in sorted(missing)]
    for name, prop in schema.get("properties", {}).items():
        problems += _defaults_missing_rule_keys(prop, f"{path}.{name}")
    if "items" in schema:
        problems += _defaults_missing_rule_keys(schema["items"], f"{path}[]")
    return problems


def test_each_default_object_holds_the_keys_its_cel_rules_read():
    """The API server checks a default object's rules as it stands: a key a rule reads must be in it.

    A CRD whose default lacked one was refused at install ("no such key: functions"), which no local test saw.
    """
    assert _defaults_missing_rule_keys(openapi_schema(), "") == []
