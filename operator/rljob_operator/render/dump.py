"""Readable multi-document YAML of rendered children: multi-line strings as `|` blocks."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_all(docs: Iterable[dict[str, Any]]) -> str:
    """`---`-separated YAML, keys in the order rendered."""
    return yaml.dump_all(list(docs), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120)
