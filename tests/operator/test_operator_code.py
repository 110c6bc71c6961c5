"""spec.code on a cluster (#54): a ConfigMap's files or a claim's folder mounted, read-only, into the pods that
import the user's code (the driver, the reward and environment pools) and put on their PYTHONPATH; the rollout
and trainer pools get neither. The real node runs a job whose reward exists only in a ConfigMap
(tests/operator/test_e2e_real.py)."""

from __future__ import annotations

from typing import Any

import yaml
from test_operator_render import REPO, groups, one, rendered

from rljob_api import parse_rljob


def calculator_job(code: dict[str, Any]) -> Any:
    doc = yaml.safe_load((REPO / "examples" / "calculator-cluster.yaml").read_text())
    doc["spec"]["code"] = code
    doc["spec"]["reward"] = {"functions": [{"name": "r", "kind": "rule", "rule": {"function": "mine:score"}}]}
    return parse_rljob(doc)


def _container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return pod_spec["containers"][0]


def test_the_code_is_mounted_and_on_the_path_where_user_code_is_imported_and_nowhere_else() -> None:
    code = {"configMap": "my-rewards", "volume": {"claimName": "team-code", "subPath": "rl/v2"}}
    docs = rendered(calculator_job(code))
    driver = one(docs, "Job")["spec"]["template"]["spec"]
    pools = {name: group["template"]["spec"] for name, group in groups(docs).items()}
    assert set(pools) == {"rollout", "trainer", "reward", "environment"}
    for name, spec in [("driver", driver), ("reward", pools["reward"]), ("environment", pools["environment"])]:
        container = _container(spec)
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["PYTHONPATH"] == "/opt/rljob/code/configmap:/opt/rljob/code/volume", name
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/opt/rljob/code/configmap"]["readOnly"] is True, name
        assert mounts["/opt/rljob/code/volume"]["subPath"] == "rl/v2", name
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["code-configmap"]["configMap"] == {"name": "my-rewards"}, name
        assert volumes["code-volume"]["persistentVolumeClaim"] == {"claimName": "team-code", "readOnly": True}, name
    for name in ("rollout", "trainer"):
        container = _container(pools[name])
        assert "PYTHONPATH" not in {e["name"] for e in container["env"]}, name
        assert not [m for m in container["volumeMounts"] if m["mountPath"].startswith("/opt/rljob/code")], name


def test_without_spec_code_no_pod_gets_a_pythonpath() -> None:
    docs = rendered(calculator_job({}))
    pods = [one(docs, "Job")["spec"]["template"]["spec"], *(g["template"]["spec"] for g in groups(docs).values())]
    assert not [p for p in pods if "PYTHONPATH" in {e["name"] for e in _container(p)["env"]}]
