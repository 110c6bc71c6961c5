"""TLS to a remote reward, with a CA and a server certificate made here: a wrong CA, no token and a
wrong token are each refused, with a message that says which."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from reward_helpers import fn, function_set, run, sample
from tls_certs import make_ca, server_certificate

from rljob.v1 import reward_service_pb2_grpc
from rljob_workers.reward import RewardFunctionSet
from rljob_workers.reward.server import RewardServicer


def test_remote_tls_refuses_a_wrong_ca_no_token_and_a_wrong_token(tmp_path: Path) -> None:
    """A CA signs the endpoint's certificate; the endpoint checks a bearer token (rljob's own
    interceptor). Trusting another CA, sending no token or a wrong one: each sample is refused, and the
    message says which."""
    from rljob_workers.common.auth import TokenCheck

    ca_key, ca_cert, ca = make_ca(tmp_path, "ca")
    _, _, other_ca = make_ca(tmp_path, "other-ca")
    key, cert = server_certificate(ca_key, ca_cert)
    (tmp_path / "right").write_text("s3cret")
    (tmp_path / "wrong").write_text("guess")

    async def go() -> dict[str, Any]:
        functions = RewardFunctionSet.from_spec([fn("exact", "rule", function="reward_fns:exact")], 5.0)
        server = grpc.aio.server(interceptors=[TokenCheck("s3cret")])
        reward_service_pb2_grpc.add_RewardServiceServicer_to_server(
            RewardServicer(functions, name="exact", max_in_flight=8), server
        )
        port = server.add_secure_port("127.0.0.1:0", grpc.ssl_server_credentials([(key, cert)]))
        await server.start()
        common: dict[str, Any] = {"endpoints": [f"127.0.0.1:{port}"], "tls": True}
        cases = {
            "right": {**common, "caFile": str(ca), "tokenFile": str(tmp_path / "right")},
            "wrong CA": {**common, "caFile": str(other_ca), "tokenFile": str(tmp_path / "right")},
            "no token": {**common, "caFile": str(ca)},
            "wrong token": {**common, "caFile": str(ca), "tokenFile": str(tmp_path / "wrong")},
        }
        results = {}
        try:
            for case, config in cases.items():
                async with function_set(fn("judge", "remote", **config)) as fs:
                    results[case] = await fs.score(sample("p/0", answer="42"))
        finally:
            await server.stop(None)
        return results

    results = run(go())
    assert results["right"].score == 1.0 and not results["right"].HasField("error")
    for case in ("wrong CA", "no token", "wrong token"):
        assert results[case].HasField("error"), case
    wrong_ca = results["wrong CA"].error.message
    assert "CERTIFICATE_VERIFY_FAILED" in wrong_ca and "(check caFile: it did not sign" in wrong_ca, wrong_ca
    assert "UNAUTHENTICATED" in results["no token"].error.message
    assert "no job token" in results["no token"].error.message
    assert "(check tokenSecret/tokenFile)" in results["no token"].error.message
    assert "wrong job token" in results["wrong token"].error.message
