"""Where pytest's time went, from the JUnit XML files the test runs wrote: the slowest tests and the
slowest modules, over every file given (the parallel and the serial run of `make test`).

    python3 .ci/slowest.py [--top N] [--write-durations tests/durations.json] FILE.xml...

--write-durations records each module's seconds, the order in which `make test`'s parallel run hands modules to
its workers (tests/conftest.py: the longest first, so that no worker is left with a long module at the end).
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def timings(files: list[Path]) -> list[tuple[float, str]]:
    """(seconds, test id) of every test case in `files` (setup, call and teardown together)."""
    found = []
    for file in files:
        if not file.is_file():
            continue
        for case in ET.parse(file).getroot().iter("testcase"):
            module = case.get("classname", "").replace(".", "/")
            found.append((float(case.get("time", 0)), f"{module}.py::{case.get('name', '?')}"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--write-durations", type=Path, default=None, help="write {module: seconds} here")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    cases = sorted(timings(args.files), reverse=True)
    if not cases:
        return
    modules: dict[str, float] = defaultdict(float)
    for seconds, test in cases:
        modules[test.split("::")[0]] += seconds
    if args.write_durations is not None:
        ordered = {module: round(seconds, 1) for module, seconds in sorted(modules.items(), key=lambda item: -item[1])}
        args.write_durations.write_text(json.dumps(ordered, indent=1) + "\n")
    total = sum(seconds for seconds, _ in cases) / 60
    print(f"slowest {min(args.top, len(cases))} of {len(cases)} tests ({total:.1f} min in all):")
    for seconds, test in cases[: args.top]:
        print(f"  {seconds:7.1f} s  {test}")
    print(f"slowest {min(args.top, len(modules))} of {len(modules)} modules:")
    for test, seconds in sorted(modules.items(), key=lambda item: -item[1])[: args.top]:
        print(f"  {seconds:7.1f} s  {test}")


if __name__ == "__main__":
    main()
