"""`make test`'s parallel run keeps each module on one pytest-xdist worker (--dist loadscope, as the Makefile
runs it): its module-scoped fixtures (a cluster, a whole `rljob run`) start once. With --dist loadgroup, under
pytest 9, every module was split over both workers, each starting the module's fixtures (CI: two 1,000-node
clusters for the scale module, the operator's rights test reading half a module): pytest-xdist 3.8 marks a
test's group by setting `item._nodeid`, which pytest 9 no longer reads."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections import defaultdict

from conftest import REPO

MODULES = ["tests/test_grpo.py", "tests/test_batching.py"]  # quick, each with several tests


def parallel_options() -> list[str]:
    """The scheduling options of `make test`'s parallel run, read from the Makefile."""
    line = next(line for line in (REPO / "Makefile").read_text().splitlines() if '-m "not serial"' in line)
    words = shlex.split(line.split("$(BIN)/pytest", 1)[1].split("-m", 1)[0])
    return [w.replace("$(WORKERS)", "2") for w in words]


def test_each_module_runs_on_one_worker() -> None:
    assert "--dist" in parallel_options(), parallel_options()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *parallel_options(), "-v", "-p", "no:cacheprovider", *MODULES],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers: dict[str, set[str]] = defaultdict(set)
    for worker, module in re.findall(r"^\[(gw\d+)\] \[[ \d%]+\] PASSED (tests/\S+?\.py)::", done.stdout, re.M):
        workers[module].add(worker)
    assert set(workers) == set(MODULES), done.stdout[-3000:]
    assert all(len(ran_on) == 1 for ran_on in workers.values()), dict(workers)
