"""spec.trainer.freeze: which parameters a pattern list keeps as loaded. Pure: the driver checks the
patterns against the model folder's weight names before anything starts, the trainer applies them to
the loaded model's parameters."""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase


def frozen_names(patterns: Sequence[str], names: Sequence[str]) -> frozenset[str]:
    """The names matched by a pattern (shell-style, case-sensitive). A pattern that matches no name,
    or patterns that match them all (nothing would train), raise ValueError naming the field."""
    for i, pattern in enumerate(patterns):
        if not any(fnmatchcase(name, pattern) for name in names):
            raise ValueError(
                f"spec.trainer.freeze[{i}]: {pattern!r} matches no parameter of the model "
                f"(its names look like {names[0]!r} … {names[-1]!r})"
            )
    frozen = frozenset(name for name in names if any(fnmatchcase(name, p) for p in patterns))
    if names and len(frozen) == len(names):
        raise ValueError(f"spec.trainer.freeze: every parameter is frozen by {list(patterns)}; nothing would train")
    return frozen
