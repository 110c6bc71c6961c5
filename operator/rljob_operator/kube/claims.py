"""The job's PersistentVolumeClaims read from the API server and checked against what its pods need
(status/volumes.py)."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from rljob_api import RLJob
from rljob_operator.status.volumes import ClaimProblem, claim_needs, claim_problem


class ClaimReader(Protocol):
    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None: ...


async def check_claims(kube: ClaimReader, job: RLJob) -> tuple[ClaimProblem, ...]:
    """The problems of the job's claims, read from the API server (one GET each)."""
    ns = job.metadata.namespace
    needs = claim_needs(job)
    found = await asyncio.gather(*(kube.get("PersistentVolumeClaim", ns, n.claim) for n in needs))
    problems = (claim_problem(need, claim, ns) for need, claim in zip(needs, found, strict=True))
    return tuple(p for p in problems if p)
