"""Prompts as people keep them, read with Hugging Face `datasets`, offline: JSON lines, JSON, parquet, CSV, a
folder `save_to_disk` wrote, or a dataset folder of such files (`load_dataset(folder)`). The rows stay in
Arrow, memory-mapped: the driver holds none of them until one is drawn (`DatasetRows`), so a million-row set
costs about what a thousand-row one does. Each row is checked as it is drawn, naming file:row and field, as
the JSON-lines reader always did; the columns are checked up front.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

if TYPE_CHECKING:
    import datasets

# Suffix -> datasets' builder of that format.
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}


class DataError(ValueError):
    """A data file that cannot be used; the message names the file, row and field."""


def _offline() -> Any:
    """`datasets`, never reaching a hub, quiet (no progress bars on the run's terminal)."""
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def open_dataset(path: Path, split: str, cache_dir: Path) -> datasets.Dataset:
    """The `split` of the data at `path`, memory-mapped; a file's format from its suffix. A file that does not
    parse is named with its first bad line where the format has lines."""
    ds = _offline()
    if not path.exists():
        raise DataError(f"{path} does not exist")
    try:
        if path.is_dir():
            return _folder(ds, path, split, cache_dir)
        builder = BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise DataError(
                f"{path}: a {path.suffix or 'suffix-less'} file; the formats read are {', '.join(BUILDERS)}"
            )
        if split != "train":
            raise DataError(f"{path}: one file holds one split, train, not {split!r} (spec.data.split)")
        return ds.load_dataset(builder, data_files=str(path), split="train", cache_dir=str(cache_dir))
    except DataError:
        raise
    except Exception as exc:  # pyarrow's and datasets' own errors name no line: find it where there are lines
        raise DataError(_first_bad_line(path) or f"{path}: {type(exc).__name__}: {_first(exc)}") from None


def _folder(ds: Any, path: Path, split: str, cache_dir: Path) -> datasets.Dataset:
    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():  # save_to_disk's
        saved = ds.load_from_disk(str(path))
        if isinstance(saved, ds.DatasetDict):
            if split not in saved:
                raise DataError(f"{path}: no split {split!r}; it has {', '.join(saved)} (spec.data.split)")
            return saved[split]
        return saved
    found = ds.load_dataset(str(path), cache_dir=str(cache_dir))
    if split not in found:
        raise DataError(f"{path}: no split {split!r}; it has {', '.join(found)} (spec.data.split)")
    return found[split]


def _first(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _first_bad_line(path: Path) -> str | None:
    """'<file>:<line>: not valid JSON (...)' for the first line of a JSON-lines file that does not parse."""
    if path.is_dir() or path.suffix.lower() != ".jsonl":
        return None
    try:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    try:
                        json.loads(line)
                    except json.JSONDecodeError as exc:
                        return f"{path}:{number}: not valid JSON ({exc.msg})"
    except UnicodeDecodeError as exc:
        return f"{path}: not UTF-8 text ({exc.reason})"
    return None


def check_columns(dataset: datasets.Dataset, names: Sequence[str], where: Path) -> None:
    """Every named column (a dotted name: a key inside a struct column) is in the data."""
    missing = [name for name in names if not _has_column(dataset.features, name.split("."))]
    if missing:
        have = ", ".join(dataset.column_names)
        raise DataError(f"{where}: missing field(s) {', '.join(missing)} (its columns: {have})")
    if not len(dataset):
        raise DataError(f"{where}: no prompts")


def _has_column(features: Any, parts: list[str]) -> bool:
    head, rest = parts[0], parts[1:]
    if not hasattr(features, "keys") or head not in features:
        return False
    return not rest or _has_column(features[head], rest)


class DatasetRows(Sequence[Any]):
    """A dataset's rows as something else (`convert(row, where)`: a Row), converted when drawn, never held."""

    def __init__(self, dataset: datasets.Dataset, path: Path, convert: Callable[[dict[str, Any], str], Any]) -> None:
        self.dataset, self.path, self.convert = dataset, path, convert

    def __len__(self) -> int:
        return len(self.dataset)

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        return self.convert(self.dataset[index], f"{self.path}:{index + 1}")

    def __iter__(self) -> Iterator[Any]:
        for index, row in enumerate(self.dataset):
            yield self.convert(row, f"{self.path}:{index + 1}")
