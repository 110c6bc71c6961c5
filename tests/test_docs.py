"""Docs that cannot rot: what the README, the guides and the examples show is checked against the code.

Every RLJob in a doc's code block and every RLJob file under examples/ passes `rljob validate` (the CLI's
own `main`, in-process); every relative link resolves to a file, and an #anchor to one of its headings;
every `rljob ...` command in a code block parses with the CLI's own argparse parser; every list of the
RLJob's conditions names exactly the operator's condition types, and each default the docs quote is the
schema's (or the code's that applies it). No Ray, a second or two.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_layout import DRIVER_FLOORS, OPERATOR_FLOORS, POOL_PACKAGES

from rljob_api import CheckpointSpec, RewardSpec, RolloutSpec, ScalingSpec, WeightSyncSpec
from rljob_api.algorithm import AlgorithmSpec, RolloutCorrectionSpec
from rljob_api.base import Model
from rljob_api.placement import Placement, default_shm_size
from rljob_operator.status.conditions import CONDITION_TYPES
from rljob_workers.driver.cli import build_parser, main

from conftest import REPO

# The docs a reader follows, each read as GitHub renders it.
DOCS = sorted(
    [
        REPO / "README.md",
        REPO / "CHANGELOG.md",
        REPO / "CONTRIBUTING.md",
        REPO / "benchmarks" / "README.md",
        REPO / "e2e" / "README.md",
        *(REPO / "docs").glob("*.md"),
    ]
)
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
# [text](target): a target with no scheme is relative to the doc's folder; images count too
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# `rljob` as a command word: at a line's start (a comment's too), after a prompt, a pipe, `&&` or `;`, or
# as .venv/bin/rljob
COMMAND = re.compile(r"(?:^\s*(?:#\s*)?|[;&|(]\s*|\$\s+)(?:\./)?(?:\.venv/bin/)?rljob\s+([^;&|#\n]*)")


def code_blocks(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line of the opening fence, info string, text) of each fenced code block of a Markdown file."""
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, fence, info = opened.groups()
        body, start = [], i + 1
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        yield start, info, "\n".join(body)
        i += 1


def prose(path: Path, code_spans: bool = False) -> str:
    """The Markdown outside code blocks, and outside inline code spans unless `code_spans` (where a link is
    a link)."""
    text, out, inside = path.read_text().splitlines(), [], None
    for line in text:
        opened = FENCE.match(line)
        if opened and inside is None:
            inside = opened.group(2)
        elif inside is not None and line.strip().startswith(inside):
            inside = None
        elif inside is None:
            out.append(line if code_spans else re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings: lower case, punctuation dropped, spaces as dashes,
    a repeated heading numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose(path, code_spans=True).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not heading:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).lower().replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def doc_rljobs() -> list[tuple[str, str]]:
    """(where, YAML) of every RLJob the docs show in a code block and every RLJob file under examples/."""
    jobs = []
    for doc in DOCS:
        for line, _info, text in code_blocks(doc):
            if re.search(r"^apiVersion:\s*rljob\.io/", text, re.M):
                jobs.append((f"{doc.relative_to(REPO)}:{line}", text))
    for example in sorted((REPO / "examples").rglob("*.yaml")):
        docs = [d for d in yaml.safe_load_all(example.read_text()) if isinstance(d, dict)]
        if any(d.get("kind") == "RLJob" for d in docs):
            jobs.append((str(example.relative_to(REPO)), example.read_text()))
    return jobs


def doc_commands() -> list[tuple[str, list[str]]]:
    """(where, argv) of every `rljob ...` command in a doc's shell code block."""
    commands = []
    for doc in DOCS:
        for line, info, text in code_blocks(doc):
            if info not in ("", "bash", "sh", "shell", "console"):
                continue
            for offset, row in enumerate(text.splitlines()):
                for found in COMMAND.finditer(row):
                    argv = shlex.split(found.group(1), comments=True)
                    commands.append((f"{doc.relative_to(REPO)}:{line + offset + 1}", argv))
    return commands


def test_the_docs_show_what_these_checks_read() -> None:
    # each extractor finds what the docs are known to hold, so a broken one cannot pass by finding nothing
    assert len([d for d in DOCS if d.exists()]) >= 10
    jobs = [where for where, _ in doc_rljobs()]
    assert "examples/arithmetic.yaml" in jobs and any(w.startswith("docs/") for w in jobs)
    verbs = {argv[0] for _, argv in doc_commands() if argv}
    assert {"run", "validate", "status", "make-model"} <= verbs


RLJOBS = doc_rljobs()


@pytest.mark.parametrize(("where", "text"), RLJOBS, ids=[where for where, _ in RLJOBS])
def test_every_rljob_in_the_docs_and_examples_validates(
    where: str, text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(text)
    code = main(["validate", str(job)])
    assert code == 0, f"{where}: `rljob validate` refuses it: {capsys.readouterr().err.strip()}"


def test_every_relative_link_resolves() -> None:
    broken = []
    for doc in DOCS:
        for target in LINK.findall(prose(doc)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            file_part, _, anchor = target.partition("#")
            dest = (doc.parent / file_part).resolve() if file_part else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc.relative_to(REPO)}: {target} (no heading with that anchor)")
    assert not broken, "\n".join(broken)


def test_every_rljob_command_in_the_docs_parses() -> None:
    parser = build_parser()
    refused = []
    for where, argv in doc_commands():
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code:
                refused.append(f"{where}: rljob {shlex.join(argv)}: {err.getvalue().strip().splitlines()[-1:]}")
    assert not refused, "\n".join(refused)


def test_the_readme_is_a_front_page_with_the_two_commands() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    for said in ("make run", "make test", ".venv/bin/rljob", "docs/"):
        assert said in readme


def test_the_checks_catch_a_bad_anchor_and_a_bad_command(tmp_path: Path) -> None:
    doc = tmp_path / "guide.md"
    doc.write_text("# On a cluster: `rljob run`\n\n## Two commands\n\n## Two commands\n\n```bash\nrljob runn x\n```\n")
    assert anchors(doc) == {"on-a-cluster-rljob-run", "two-commands", "two-commands-1"}
    (argv,) = [shlex.split(found.group(1)) for found in COMMAND.finditer(next(code_blocks(doc))[2])]
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        build_parser().parse_args(argv)


def test_contributing_lists_every_package_and_room_in_its_layout() -> None:
    layout = (REPO / "CONTRIBUTING.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    packages, rooms = layout.split("### The driver's rooms", 1)
    listed = set(re.findall(r"^\| `(\w+)/`", packages, re.M)) | set(re.findall(r"^\| `\w+/`, `(\w+)/`", packages, re.M))
    assert listed == {*POOL_PACKAGES, "driver"}, "CONTRIBUTING.md's layout table and tests/test_layout.py differ"
    rooms, operator_rooms = rooms.split("### The operator's rooms", 1)
    floors = re.findall(r"^\| `(\w+)(?:/|\.py)`", rooms, re.M)
    assert tuple(floors) == DRIVER_FLOORS, "CONTRIBUTING.md's driver rooms and tests/test_layout.py's floors differ"
    # the operator's: a row may name several modules of one floor (`names.py`, `options.py`, `config.py`)
    first_cells = re.findall(r"^\| ((?:`\w+(?:/|\.py)`(?:, )?)+) \|", operator_rooms, re.M)
    operator_floors = tuple(name for cell in first_cells for name in re.findall(r"`(\w+)(?:/|\.py)`", cell))
    assert operator_floors == tuple(f for f in OPERATOR_FLOORS if f != "__main__"), (
        "CONTRIBUTING.md's operator rooms and tests/test_layout.py's OPERATOR_FLOORS differ"
    )


def test_every_rljob_validate_the_docs_show_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    # the files they name are the repository's: run them as a reader would, from its root (--deep needs the
    # model that `make run` builds, so those are only parsed, above)
    monkeypatch.chdir(REPO)
    shown = [(where, argv) for where, argv in doc_commands() if argv[:1] == ["validate"] and "--deep" not in argv]
    assert shown
    failed = []
    for where, argv in shown:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            if main(argv) != 0:
                failed.append(f"{where}: rljob {shlex.join(argv)}: {err.getvalue().strip()}")
    assert not failed, "\n".join(failed)


# Every list of the RLJob's conditions: the words after CONDITIONS_MARK, to the end of that sentence.
CONDITION_DOCS = [
    REPO / "docs" / "observability.md",
    REPO / "operator" / "README.md",
    REPO / "charts" / "rljob-operator" / "templates" / "NOTES.txt",
]
CONDITIONS_MARK = "the conditions, one per type"


def condition_list(text: str) -> list[str]:
    """The condition types a text lists after CONDITIONS_MARK, to the end of that sentence (`.` or `;`);
    what is in parentheses (a condition's meaning, its reasons) is left out."""
    at = text.lower().find(CONDITIONS_MARK)
    if at < 0:
        return []
    paragraph = text[at + len(CONDITIONS_MARK) :].split("\n\n")[0]
    while (shorter := re.sub(r"\([^()]*\)", "", paragraph)) != paragraph:
        paragraph = shorter
    sentence = re.split(r"[.;](?:\s|$)", paragraph, maxsplit=1)[0]
    return re.findall(r"\b[A-Z][A-Za-z0-9]*\b", sentence)


def test_the_condition_list_reader_skips_reasons_and_stops_at_the_sentence() -> None:
    text = "The conditions, one per type: `A`, `BReady` (else `Why`, e.g. `Other`), `C`. Beside them: `D`."
    assert condition_list(text) == ["A", "BReady", "C"]
    assert condition_list("kubectl describe  # the conditions, one per type: A, B\n\nC") == ["A", "B"]


@pytest.mark.parametrize("doc", CONDITION_DOCS, ids=[str(d.relative_to(REPO)) for d in CONDITION_DOCS])
def test_every_condition_list_names_each_condition_type(doc: Path) -> None:
    listed = condition_list(doc.read_text())
    assert len(listed) == len(set(listed)) and set(listed) == set(CONDITION_TYPES), (
        f"{doc.relative_to(REPO)}: its list after {CONDITIONS_MARK!r} names {listed}; "
        f"the operator sets {list(CONDITION_TYPES)} (operator/rljob_operator/status/conditions.py)"
    )


def flat(path: Path) -> str:
    """A file's text with every run of whitespace one space, so a quote may wrap across lines."""
    return " ".join(path.read_text().split())


def test_the_shm_default_in_gpu_sizing_is_default_shm_size() -> None:
    said = re.search(
        r"for a rollout pool whose engine is vllm or sglang, (\d+)Gi per GPU of the pod, at least (\d+)Gi; "
        r"for every other pod, (\d+)Gi per GPU when it has more than one GPU, else (\d+Mi)",
        flat(REPO / "docs" / "gpu-sizing.md"),
    )
    assert said, "docs/gpu-sizing.md no longer states the /dev/shm default in the words this test reads"
    engine_per_gpu, engine_least, per_gpu, small = said.groups()

    def as_documented(gpus: int, engine: str | None) -> str:
        if engine in ("vllm", "sglang"):
            return f"{max(int(engine_per_gpu) * gpus, int(engine_least))}Gi"
        return f"{int(per_gpu) * gpus}Gi" if gpus > 1 else small

    for gpus in range(9):
        for engine in (None, "hf", "vllm", "sglang"):
            assert default_shm_size(gpus, engine) == as_documented(gpus, engine), (gpus, engine)


def default(model: type[Model], name: str) -> Any:
    return model.model_fields[name].default


def module_constant(path: Path, name: str) -> Any:
    """A module-level constant's value (an arithmetic expression of literals), read without importing it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return eval(compile(ast.Expression(node.value), str(path), "eval"), {"__builtins__": {}})
    raise AssertionError(f"{path}: no {name}")


MIB = 1024 * 1024
PUBLISHER = REPO / "workers" / "rljob_workers" / "weights" / "publisher.py"
# (doc, its words quoting a default, `{}` where the value stands, the value the code has)
QUOTED_DEFAULTS: list[tuple[str, str, Any]] = [
    ("docs/gpu-sizing.md", "`gpuMemoryUtilization` ({})", default(RolloutSpec, "gpu_memory_utilization")),
    ("docs/vllm.md", "`gpuMemoryUtilization` ({})", default(RolloutSpec, "gpu_memory_utilization")),
    ("docs/vllm.md", "- `{}` (the default, and the only mode of `hf`)", default(RolloutSpec, "weight_update")),
    ("docs/vllm.md", "- `mode: {}` (default)", default(RolloutCorrectionSpec, "mode")),
    ("docs/vllm.md", "Yao et al. 2025; `high` {})", default(RolloutCorrectionSpec, "high")),
    ("docs/vllm.md", "Ling Team 2025; `low` {})", default(RolloutCorrectionSpec, "low")),
    ("docs/concepts.md", "`spec.algorithm.maxStaleness` (default {})", default(AlgorithmSpec, "max_staleness")),
    ("docs/concepts.md", "`spec.<pool>.maxRestarts` replicas ({})", default(Placement, "max_restarts")),
    ("docs/troubleshooting.md", "`spec.<pool>.maxRestarts` replicas ({})", default(Placement, "max_restarts")),
    ("docs/checkpoints.md", "`spec.checkpoint.keep` ({})", default(CheckpointSpec, "keep")),
    ("docs/rewards.md", "(`spec.reward.timeoutSeconds`, {} s per sample)", default(RewardSpec, "timeout_seconds")),
    ("docs/rewards.md", "`spec.reward.onError` (`{}`)", default(RewardSpec, "on_error")),
    ("docs/rewards.md", "`spec.reward.retries` ({}) retries", default(RewardSpec, "retries")),
    ("e2e/README.md", "`scaleDownWindowSeconds` ({} s by default", default(ScalingSpec, "scale_down_window_seconds")),
    (
        "docs/observability.md",
        "`operator.interval` seconds ({})",
        yaml.safe_load((REPO / "charts" / "rljob-operator" / "values.yaml").read_text())["operator"]["interval"],
    ),
    # weightSync.bucketSizeMb: unset in the schema, the publisher's default by the buckets' device (gloo: CPU)
    ("docs/concepts.md", "unset: {} MiB on gloo", module_constant(PUBLISHER, "CPU_BUCKET_BYTES") // MIB),
    ("docs/concepts.md", "{} MiB on NCCL)", module_constant(PUBLISHER, "CUDA_BUCKET_BYTES") // MIB),
    ("docs/vllm.md", "unset on gloo it is {} MiB", module_constant(PUBLISHER, "CPU_BUCKET_BYTES") // MIB),
]


def test_the_bucket_size_default_is_unset_in_the_schema() -> None:
    assert default(WeightSyncSpec, "bucket_size_mb") is None  # so the publisher's defaults (above) apply


def quoted(text: str, words: str) -> list[str]:
    """Every value `words` quote in `text` (whitespace-flattened), where `{}` stands."""
    before, after = (re.escape(part) for part in words.split("{}"))
    return re.findall(before + r"([\w.]+?)" + after, text)


def same(said: str, value: Any) -> bool:
    """Whether a doc's `said` is `value`: a number as a number (60 is 60.0), anything else as written."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return re.fullmatch(r"\d+(\.\d+)?", said) is not None and float(said) == value
    return said == str(value)


@pytest.mark.parametrize(("doc", "words", "value"), QUOTED_DEFAULTS, ids=[f"{d}:{w}" for d, w, _ in QUOTED_DEFAULTS])
def test_every_default_the_docs_quote_is_the_codes(doc: str, words: str, value: Any) -> None:
    found = quoted(flat(REPO / doc), words)
    assert found, f"{doc} no longer quotes {words!r}: update QUOTED_DEFAULTS with what it says now"
    assert all(same(said, value) for said in found), f"{doc}: {words!r} says {found}, the code's default is {value!r}"


def test_a_changed_default_fails_the_quote_check() -> None:
    text = "each pool may lose `spec.<pool>.maxRestarts` replicas (3) in a run; unset: 8 MiB on gloo"
    assert quoted(text, "`spec.<pool>.maxRestarts` replicas ({})") == ["3"]
    assert same("3", 3) and same("0.85", 0.85) and same("60", 60.0) and same("drain", "drain")
    assert not same("4", 3) and not same("3.", 3) and not same("2.0", 2.5)
