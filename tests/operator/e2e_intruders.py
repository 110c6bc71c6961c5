"""Intruders against a job training on the real node: pods that reach the job's ports (the e2e node's
bridge enforces no NetworkPolicy) without the job's token, each call's answer printed as JSON.

- `intrude`: a pod of another namespace calls the job's ControlService (Stop) and a trainer's
  WeightService (FetchWeights), with no token and with a wrong one.
- `intrude_on_ray`: a pod in the job's own namespace wearing the job's label (which anyone allowed to make
  a pod there can put on one, so the NetworkPolicy admits it) tries Ray's own doors on the head: the
  dashboard's job API (list, and submit a job that would print the job's token file), the GCS and the
  Ray client port. Ray's token authentication (authOptions) must refuse each.
"""

from __future__ import annotations

import json
import re
from typing import Any

from e2e_cluster import Cluster, wait_for
from e2e_real import ENV_MOUNT, NODE_SELECTOR, TOLERATIONS
from e2e_registry import PULL_SECRET

INTRUDER_NS = "rljob-e2e-intruder"
# Stop the job and FetchWeights from its trainer, without the job's token and with a wrong one.
GRPC_SCRIPT = """
import asyncio, json, sys
import grpc
from rljob.v1 import control_service_pb2 as c, weight_service_pb2 as w

async def code(address, path, request, parse, streaming, metadata):
    async with grpc.aio.insecure_channel(address) as ch:
        call = (ch.unary_stream if streaming else ch.unary_unary)(
            path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=parse)
        try:
            if streaming:
                async for _ in call(request, metadata=metadata, timeout=10):
                    pass
            else:
                await call(request, metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
    return "OK"

async def main(control, weights):
    calls = {
        "Stop": (control, "/rljob.v1.ControlService/Stop", c.StopRequest(), c.StopResponse.FromString, False),
        "FetchWeights": (weights, "/rljob.v1.WeightService/FetchWeights", w.FetchWeightsRequest(),
                         w.FetchWeightsResponse.FromString, True),
    }
    out = {}
    for name, args in calls.items():
        out[name] = [await code(*args, ()), await code(*args, (("authorization", "Bearer not-the-token"),))]
    print(json.dumps(out))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""
# Ray's doors on the head, without a token and with a wrong one: an HTTP status, or a gRPC code (and Ray's
# words); a door that let the caller in answers 2xx or OK (or NOT_FOUND for the raw gRPC calls, whose empty
# request Ray cannot parse: it was let in).
RAY_SCRIPT = """
import json, sys, urllib.request, urllib.error
import grpc

HEAD = sys.argv[1]
SUBMIT = {"entrypoint": "cat /var/run/rljob/token", "submission_id": "intruder"}

def http(method, path, body, token):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = "Bearer " + token
    data = json.dumps(body).encode() if body else None
    req = urllib.request.Request(f"http://{HEAD}:8265{path}", data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return f"{r.status} {r.read()[:120]!r}"
    except urllib.error.HTTPError as e:
        return f"{e.code} {e.read()[:120].decode(errors='replace')}"
    except OSError as e:
        return f"unreachable {e}"

def grpc_call(port, path, token):
    metadata = (("authorization", "Bearer " + token),) if token else ()
    with grpc.insecure_channel(f"{HEAD}:{port}") as ch:
        call = ch.unary_unary(path, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        try:
            call(b"", timeout=10, metadata=metadata)
        except grpc.RpcError as e:
            return f"{e.code().name} {e.details()[:120]}"
    return "OK"

out = {}
for token in ("", "not-the-token"):
    out.setdefault("dashboard: list jobs", []).append(http("GET", "/api/jobs/", None, token))
    out.setdefault("dashboard: submit a job", []).append(http("POST", "/api/jobs/", SUBMIT, token))
    out.setdefault("GCS: list nodes", []).append(grpc_call(6379, "/ray.rpc.NodeInfoGcsService/GetAllNodeInfo", token))
    out.setdefault("Ray client: cluster info", []).append(grpc_call(10001, "/ray.rpc.RayletDriver/ClusterInfo", token))
print(json.dumps(out))
"""


def intruder_pod(name: str, namespace: str, image: str, labels: dict[str, str], args: list[str]) -> dict[str, Any]:
    """A pod on the real node running the worker image's Python on `args`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": NODE_SELECTOR,  # the real node, not a kwok one
            "tolerations": TOLERATIONS,
            "imagePullSecrets": [{"name": PULL_SECRET}],
            "containers": [
                {
                    "name": "intruder",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": [f"{ENV_MOUNT}/bin/python", "-c", *args],
                }
            ],
        },
    }


def _run(cluster: Cluster, pod: dict[str, Any]) -> dict[str, list[str]]:
    """Apply the pod, wait for it to end; what its last line printed."""
    name, namespace = pod["metadata"]["name"], pod["metadata"]["namespace"]
    cluster.apply(pod)
    wait_for(
        f"the intruder pod {name} to finish",
        lambda: (cluster.get("pod", name, namespace) or {}).get("status", {}).get("phase") in ("Succeeded", "Failed"),
        timeout=120,
    )
    out = cluster.kubectl("logs", "-n", namespace, name).stdout
    assert out.strip(), cluster.kubectl("describe", "pod", "-n", namespace, name).stdout
    # gone before the job is deleted: one wearing the job's label is no child of it, and would stay
    cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=true", "--timeout=50s")
    result: dict[str, list[str]] = json.loads(out.strip().splitlines()[-1])
    print(f"intruder {namespace}/{name}:", json.dumps(result, indent=1), flush=True)
    return result


def intrude(
    cluster: Cluster, image: str, pull_secret: dict[str, Any], namespace: str, job: str
) -> dict[str, list[str]]:
    """Run the gRPC intruder (its image pulled with `pull_secret`, a Secret made in its namespace) against the
    running job from another namespace; what each of its calls got."""
    log = cluster.kubectl("logs", "-n", namespace, f"job/{job}-driver").stdout
    found = re.search(r"WeightService on (\S+)", log)
    assert found, f"the driver did not log its WeightService address:\n{log[-2000:]}"
    control = f"{job}-control.{namespace}.svc:50051"
    cluster.kubectl("create", "namespace", INTRUDER_NS, check=False)
    cluster.apply({**pull_secret, "metadata": {**pull_secret["metadata"], "namespace": INTRUDER_NS}})
    return _run(cluster, intruder_pod("intruder", INTRUDER_NS, image, {}, [GRPC_SCRIPT, control, found.group(1)]))


def intrude_on_ray(cluster: Cluster, image: str, namespace: str, job: str) -> dict[str, list[str]]:
    """Run the Ray intruder in the job's namespace, wearing the job's label, against its Ray head."""
    head = f"{job}-ray-head-svc.{namespace}.svc"
    labels = {"rljob.io/job": job}
    return _run(cluster, intruder_pod("ray-intruder", namespace, image, labels, [RAY_SCRIPT, head]))


def refused(answers: list[str]) -> bool:
    """Every answer a refusal for want of the token: HTTP 401/403 or gRPC UNAUTHENTICATED."""
    return all(re.match(r"(401|403|UNAUTHENTICATED)\b", answer) for answer in answers)
