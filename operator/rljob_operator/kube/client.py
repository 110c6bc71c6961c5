"""The thin Kubernetes adapter: server-side apply with one field manager, get, list, delete, status patch.

The official client is synchronous; its calls run on a bounded thread pool so the kopf event loop
never blocks.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlencode

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.utils.retry import DEFAULT_RETRY_AFTER_BACKOFF, is_retry_after_response, on_retry_after_error

from rljob_api import GROUP, PLURAL, VERSION
from rljob_operator.names import FIELD_MANAGER

# kind -> (API group path, plural) for every kind the operator touches.
KINDS: dict[str, tuple[str, str]] = {
    "ServiceAccount": ("api/v1", "serviceaccounts"),
    "ConfigMap": ("api/v1", "configmaps"),
    "Secret": ("api/v1", "secrets"),
    "Service": ("api/v1", "services"),
    "Pod": ("api/v1", "pods"),
    "PersistentVolumeClaim": ("api/v1", "persistentvolumeclaims"),
    "Event": ("api/v1", "events"),
    "Role": ("apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Job": ("apis/batch/v1", "jobs"),
    "NetworkPolicy": ("apis/networking.k8s.io/v1", "networkpolicies"),
    "RayCluster": ("apis/ray.io/v1", "rayclusters"),
    "RLJob": (f"apis/{GROUP}/{VERSION}", PLURAL),
}


def describe(exc: BaseException) -> str:
    """One line for an API error: `403 Forbidden: <the API server's message>`."""
    if not isinstance(exc, ApiException):
        return f"{type(exc).__name__}: {exc}"
    message = ""
    try:
        message = json.loads(exc.body or "{}").get("message", "")
    except (ValueError, AttributeError):
        message = str(exc.body or "")[:300]
    return f"{exc.status} {exc.reason}: {message}" if message else f"{exc.status} {exc.reason}"


def load_api_client(pool_size: int) -> client.ApiClient:
    """In-cluster credentials when in a pod, else the kubeconfig (KUBECONFIG)."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    configuration = client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


def path(kind: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    prefix, plural = KINDS[kind]
    out = f"/{prefix}/namespaces/{namespace}/{plural}"
    if name:
        out += f"/{name}"
    if subresource:
        out += f"/{subresource}"
    return out


def urgent_workers(workers: int) -> int:
    """The threads of Kube's urgent lane, beside its `workers`."""
    return max(2, workers // 4)


class Kube:
    """Async wrappers over the synchronous client, run on a thread pool of `workers` threads."""

    def __init__(self, api: client.ApiClient, workers: int = 16) -> None:
        self.api = api
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kube")
        # A lane of its own for what users wait on (a new job's pools), so it never queues behind
        # status patches and the other children of a burst of jobs.
        self.urgent = ThreadPoolExecutor(max_workers=urgent_workers(workers), thread_name_prefix="kube-urgent")

    def _request(self, method: str, url: str, body: Any = None, content_type: str = "application/json") -> Any:
        """One API call; sent again, whatever the verb, while the API server turns it away with a
        Retry-After (429 Too Many Requests, or a 5xx such as "storage is (re)initializing"): it was
        not processed. client-go's rest.Request does the same; the client does it for GETs only."""
        send = functools.partial(self._send, method, url, body, content_type)
        return on_retry_after_error(DEFAULT_RETRY_AFTER_BACKOFF, is_retry_after_response, send)

    def _send(self, method: str, url: str, body: Any, content_type: str) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        self.api.update_params_for_auth(headers, None, ["BearerToken"], url, method, body)
        response = self.api.call_api(method, self.api.configuration.host + url, headers, body, _request_timeout=30)
        data = response.read()
        if not 200 <= response.status < 300:
            raise ApiException(http_resp=response)
        return json.loads(data) if data else None

    async def _call(
        self, method: str, url: str, body: Any = None, content_type: str = "application/json", urgent: bool = False
    ) -> Any:
        loop = asyncio.get_running_loop()
        pool = self.urgent if urgent else self.pool
        return await loop.run_in_executor(pool, self._request, method, url, body, content_type)

    async def apply(self, doc: dict[str, Any], *, urgent: bool = False) -> dict[str, Any]:
        """Server-side apply as `rljob-operator`, taking over conflicting fields (the operator owns them)."""
        meta = doc["metadata"]
        query = urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
        url = path(doc["kind"], meta["namespace"], meta["name"]) + "?" + query
        result: dict[str, Any] = await self._call("PATCH", url, doc, "application/apply-patch+yaml", urgent)
        return result

    async def create(self, doc: dict[str, Any]) -> bool:
        """Create `doc` as it is; False if an object of that name is already there (it is left alone)."""
        try:
            await self._call("POST", path(doc["kind"], doc["metadata"]["namespace"]), doc, urgent=True)
            return True
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await self._call("GET", path(kind, namespace, name))
            return result
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, kind: str, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        query = urlencode({"labelSelector": ",".join(f"{k}={v}" for k, v in selector.items())})
        result = await self._call("GET", path(kind, namespace) + "?" + query)
        return list(result.get("items") or [])

    async def delete(self, kind: str, namespace: str, name: str, *, uid: str | None = None) -> bool:
        """Delete with background propagation (a Job's pods go too); False if it was not there. `uid`: only
        that object (the API server refuses with 409 when the name now holds another)."""
        body: dict[str, Any] = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        if uid is not None:
            body["preconditions"] = {"uid": uid}
        try:
            await self._call("DELETE", path(kind, namespace, name), body)
            return True
        except ApiException as exc:
            if exc.status == 404 or (uid is not None and exc.status == 409):
                return False
            raise

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> bool:
        """Merge-patch the RLJob's status subresource (None values remove fields); False if the RLJob
        is gone (deleted while it was being refreshed: there is no finalizer to hold it)."""
        url = path("RLJob", namespace, name, "status")
        try:
            await self._call("PATCH", url, {"status": status}, "application/merge-patch+json")
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise

    async def post_event(self, involved: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """A core/v1 Event about `involved` (an RLJob reference), as `kubectl describe` shows it."""
        meta = involved["metadata"]
        now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": kind,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": socket.gethostname(),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self._call("POST", path("Event", meta["namespace"]), event)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.urgent.shutdown(wait=False, cancel_futures=True)
        self.api.close()
