"""The Kubernetes adapter's handling of an API server that turns requests away, against a real HTTP
server on loopback that answers as kube-apiserver does when it throttles (the e2e control plane
cannot be made to throttle on cue)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rljob_operator.kube.client import Kube

THROTTLED = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "TooManyRequests", "code": 429}


class ApiServer(ThreadingHTTPServer):
    """Answers each request with the next of `answers` (status, Retry-After or None), then 200."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.answers: list[tuple[int, str | None]] = []
        self.seen: list[tuple[str, str, bytes]] = []


class Handler(BaseHTTPRequestHandler):
    server: ApiServer

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append((self.command, self.path, body))
        status, retry_after = self.server.answers.pop(0) if self.server.answers else (200, None)
        payload = json.dumps(THROTTLED if status != 200 else {"kind": "RLJob"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_PATCH = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ApiServer]:
    s = ApiServer()
    thread = threading.Thread(target=s.serve_forever, daemon=True)
    thread.start()
    yield s
    s.shutdown()
    s.server_close()


def kube_for(server: ApiServer) -> Kube:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    return Kube(client.ApiClient(configuration), workers=1)


def test_a_request_turned_away_with_retry_after_is_sent_again_whatever_the_verb(server: ApiServer) -> None:
    server.answers = [(429, "0"), (503, "0"), (429, "1")]  # throttled, "storage is (re)initializing", throttled
    kube = kube_for(server)
    try:
        assert asyncio.run(kube.patch_status("ns", "job", {"phase": "Running"})) is True
    finally:
        kube.close()
    assert [(method, path) for method, path, _ in server.seen] == [
        ("PATCH", "/apis/rljob.io/v1alpha1/namespaces/ns/rljobs/job/status")
    ] * 4
    assert {body for _, _, body in server.seen} == {b'{"status": {"phase": "Running"}}'}  # the same patch


@pytest.mark.parametrize(("status", "retry_after"), [(429, None), (500, None), (409, "1")])
def test_a_refusal_without_retry_after_or_not_a_throttle_is_raised_at_once(
    server: ApiServer, status: int, retry_after: str | None
) -> None:
    """As client-go: only a 429 or 5xx that says when to come back is retried."""
    server.answers = [(status, retry_after)]
    kube = kube_for(server)
    try:
        with pytest.raises(ApiException) as info:
            asyncio.run(kube.patch_status("ns", "job", {"phase": "Running"}))
    finally:
        kube.close()
    assert info.value.status == status
    assert len(server.seen) == 1
