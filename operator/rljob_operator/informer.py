"""Informers: the children an RLJob owns (RayClusters, driver Jobs, pods), kept in memory by list+watch.

A status refresh then reads memory, not the API server: with many RLJobs, polling each job's
children every interval would cost three requests per job per interval. Each informer lists and
watches one kind, server-side filtered by the `rljob.io/job` label, in its own thread, and tells
the operator which job changed so it can refresh that job at once.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlencode

from kubernetes import client

from .kube import KINDS
from .names import LABEL_JOB

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, job name)


class Informer:
    """The objects of one kind labelled `rljob.io/job`, in the watched namespaces (all if none)."""

    def __init__(
        self,
        api: client.ApiClient,
        kind: str,
        namespaces: tuple[str, ...] = (),
        on_change: Callable[[Key], None] | None = None,
    ) -> None:
        self.api = api
        self.kind = kind
        self.namespaces = namespaces or ("",)
        self.on_change = on_change or (lambda key: None)
        self._objects: dict[tuple[str, str], dict[str, Any]] = {}  # (namespace, name) -> object
        self._lock = threading.Lock()
        self._synced = {ns: threading.Event() for ns in self.namespaces}
        self._stop = threading.Event()

    # ------------------------------------------------------------ reading
    def synced(self) -> bool:
        return all(e.is_set() for e in self._synced.values())

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        return all(e.wait(max(0.0, deadline - time.monotonic())) for e in self._synced.values())

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((namespace, name))

    def of_job(self, namespace: str, job: str) -> list[dict[str, Any]]:
        with self._lock:
            return [
                o
                for (ns, _), o in self._objects.items()
                if ns == namespace and (o["metadata"].get("labels") or {}).get(LABEL_JOB) == job
            ]

    # ------------------------------------------------------------ running
    def start(self) -> None:
        for ns in self.namespaces:
            threading.Thread(target=self._run, args=(ns,), name=f"informer-{self.kind}-{ns}", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _url(self, namespace: str, **query: str) -> str:
        prefix, plural = KINDS[self.kind]
        where = f"/namespaces/{namespace}" if namespace else ""
        query = {"labelSelector": LABEL_JOB, **query}
        return f"{self.api.configuration.host}/{prefix}{where}/{plural}?{urlencode(query)}"

    def _request(self, url: str, timeout: float, stream: bool) -> Any:
        headers = {"Accept": "application/json"}
        self.api.update_params_for_auth(headers, None, ["BearerToken"], url, "GET", None)
        return self.api.rest_client.pool_manager.request(
            "GET", url, headers=headers, preload_content=not stream, timeout=timeout
        )

    def _run(self, namespace: str) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                version = self._list(namespace)
                self._synced[namespace].set()
                backoff = 1.0
                self._watch(namespace, version)
            except Exception as exc:  # reconnect after any failure (e.g. KubeRay's CRD not there yet); relist
                log.warning("informer %s %s: %s; relisting in %.0fs", self.kind, namespace or "*", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _list(self, namespace: str) -> str:
        response = self._request(self._url(namespace), timeout=60, stream=False)
        if response.status != 200:
            raise RuntimeError(f"list {self.kind}: {response.status} {response.data[:300]!r}")
        body = json.loads(response.data)
        fresh = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in body.get("items") or []}
        with self._lock:
            stale = {k for k in self._objects if (not namespace or k[0] == namespace)} - set(fresh)
            changed = [self._objects.pop(k) for k in stale] + list(fresh.values())
            self._objects.update(fresh)
        for obj in changed:
            self._notify(obj)
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, namespace: str, version: str) -> None:
        while not self._stop.is_set():
            url = self._url(
                namespace, watch="true", resourceVersion=version, allowWatchBookmarks="true", timeoutSeconds="300"
            )
            response = self._request(url, timeout=330, stream=True)
            try:
                for event in _lines(response):
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        return  # e.g. 410 Gone: relist
                    version = obj["metadata"]["resourceVersion"]
                    if kind == "BOOKMARK":
                        continue
                    key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
                    with self._lock:
                        if kind == "DELETED":
                            self._objects.pop(key, None)
                        else:
                            self._objects[key] = obj
                    self._notify(obj)
            finally:
                response.release_conn()

    def _notify(self, obj: dict[str, Any]) -> None:
        job = (obj["metadata"].get("labels") or {}).get(LABEL_JOB)
        if job:
            self.on_change((obj["metadata"]["namespace"], job))


def _lines(response: Any) -> Iterator[dict[str, Any]]:
    buffer = b""
    for chunk in response.stream(65536, decode_content=False):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield json.loads(line)


class Children:
    """The three informers an operator needs."""

    KINDS = ("RayCluster", "Job", "Pod")

    @classmethod
    def watches(cls, namespaces: tuple[str, ...]) -> int:
        """Watch connections held at once: one per kind and namespace (one per kind for all)."""
        return len(cls.KINDS) * max(1, len(namespaces))

    def __init__(self, api: client.ApiClient, namespaces: tuple[str, ...], on_change: Callable[[Key], None]) -> None:
        self.ray_clusters, self.jobs, self.pods = (Informer(api, kind, namespaces, on_change) for kind in self.KINDS)
        self.all = (self.ray_clusters, self.jobs, self.pods)

    def start(self) -> None:
        for informer in self.all:
            informer.start()

    def stop(self) -> None:
        for informer in self.all:
            informer.stop()

    def synced(self) -> bool:
        return all(i.synced() for i in self.all)
