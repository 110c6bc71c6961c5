"""A remote reward's or environment's bearer token goes only over TLS (#53): `rljob validate` refuses a
token without it in one line naming the field, unless every endpoint is on loopback or the spec says
`insecure: true` (then it warns). The CRD's own rule is tests/operator/test_operator_crd.py's."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any


def test_a_token_without_tls_is_refused_unless_the_spec_says_insecure(tmp_path, example_doc):
    """`rljob validate` as a user runs it: a bearer token to an endpoint off this machine needs TLS; insecure: true
    lets it through with a warning; on loopback the token never crosses a network."""
    import yaml

    cli = [sys.executable, "-m", "rljob_workers.driver.cli", "validate"]

    def validate(remote: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        doc = copy.deepcopy(example_doc)
        doc["spec"]["reward"]["functions"].append({"name": "judge", "kind": "remote", "remote": remote})
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(doc))
        return subprocess.run([*cli, str(path)], capture_output=True, text=True, timeout=60)

    token = {"tokenSecret": {"name": "judge-token", "key": "token"}}
    refused = validate({"endpoints": ["judge.research.svc:50052"], **token})
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[1:] == [
        "  spec.reward.functions[1].remote.tls: a bearer token (tokenSecret or tokenFile) goes only over TLS: "
        "set tls: true (or insecure: true to send it in clear text)"
    ]
    warned = validate({"endpoints": ["judge.research.svc:50052"], "insecure": True, **token})
    assert warned.returncode == 0, warned.stderr
    assert warned.stderr.strip().endswith(
        "warning: spec.reward.functions[1].remote: insecure: true sends the bearer token in clear text to "
        "judge.research.svc:50052"
    )
    for remote in ({"endpoints": ["judge.research.svc:50052"], "tls": True}, {"endpoints": ["127.0.0.1:50052"]}):
        quiet = validate({**remote, **token})
        assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr
