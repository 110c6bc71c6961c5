"""TensorBoard: event files in <output>/tensorboard, written with TensorBoard's own writer (torch's
SummaryWriter would load torch into the driver, which `rljob run` keeps without it)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboard.compat.proto.tensor_pb2 import TensorProto
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.compat.proto.types_pb2 import DT_STRING
from tensorboard.summary.writer.event_file_writer import EventFileWriter

from .base import RunInfo, SampleTable, flat_params

FOLDER = "tensorboard"
CONFIG_TAG = "config"  # the job's settings, a markdown table in the Text tab
SAMPLES_TAG = "samples"  # each step's logged samples, a markdown table in the Text tab


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table; a cell's pipes and line breaks escaped so that each row stays one row."""

    def line(cells: Iterable[object]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", "<br>") for c in cells) + " |"

    return "\n".join([line(columns), "|" + "---|" * len(columns), *(line(row) for row in rows)])


def settings_table(config: Mapping[str, object]) -> str:
    """The settings as a markdown table, one row per setting."""
    rows = [(f"`{name}`", f"`{value}`") for name, value in flat_params(dict(config)).items()]
    return markdown_table(("setting", "value"), rows)


def text_summary(tag: str, text: str) -> Summary:
    """A summary TensorBoard's Text tab shows (the text plugin's string tensor)."""
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
    tensor = TensorProto(
        dtype=DT_STRING, string_val=[text.encode()], tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)])
    )
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata, tensor=tensor)])


class TensorBoard:
    """One event file per run (a resumed run adds a new one to the same folder: TensorBoard reads them all)."""

    def __init__(self, run: RunInfo) -> None:
        self.folder = run.output / FOLDER
        self.writer = EventFileWriter(str(self.folder))
        self._write(0, text_summary(CONFIG_TAG, settings_table(run.config)))

    def _write(self, step: int, summary: Summary) -> None:
        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        values = [Summary.Value(tag=name, simple_value=value) for name, value in scalars.items()]
        self._write(step, Summary(value=values))
        self.writer.flush()  # each step on disk as it ends: `tensorboard --logdir` follows the run

    def log_samples(self, step: int, table: SampleTable) -> None:
        self._write(step, text_summary(SAMPLES_TAG, markdown_table(table.columns, table.rows)))
        self.writer.flush()

    def close(self, exit_code: int) -> None:
        self.writer.close()
