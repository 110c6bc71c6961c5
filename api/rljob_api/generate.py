"""Write every file generated from the schema; tests compare them with what is committed."""

from __future__ import annotations

from pathlib import Path

from .crd import crd_yaml
from .reference import reference_markdown

CRD_FILE = "rljob.io_rljobs.yaml"
CHART = "charts/rljob-operator"


def generated_files() -> dict[str, str]:
    """Repo-relative path -> content of every file generated from rljob_api."""
    crd = crd_yaml()
    return {
        f"crds/{CRD_FILE}": crd,
        f"{CHART}/crds/{CRD_FILE}": crd,
        "docs/reference.md": reference_markdown(),
    }


def write_generated(root: Path) -> list[Path]:
    """Write the generated files under the repo root; returns the paths written."""
    written = []
    for relative, content in generated_files().items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        written.append(path)
    return written
