"""Docs that cannot rot: what the README, the guides and the examples show is checked against the code.

Every RLJob in a doc's code block and every RLJob file under examples/ passes `rljob validate` (the CLI's
own `main`, in-process); every relative link resolves to a file, and an #anchor to one of its headings;
every `rljob ...` command in a code block parses with the CLI's own argparse parser. No Ray, a second or
two.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from test_layout import ALLOWED

from rljob_workers.driver.cli import build_parser, main

from conftest import REPO

# The docs a reader follows, each read as GitHub renders it.
DOCS = sorted(
    [
        REPO / "README.md",
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


def test_contributing_lists_every_workers_package_in_its_layout() -> None:
    layout = (REPO / "CONTRIBUTING.md").read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)/`", layout, re.M)) | set(re.findall(r"^\| `\w+/`, `(\w+)/`", layout, re.M))
    assert listed == set(ALLOWED), "CONTRIBUTING.md's layout table and tests/test_layout.py's ALLOWED differ"


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
