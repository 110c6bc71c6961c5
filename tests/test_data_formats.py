"""Data as people keep it (#54): JSON lines, JSON, parquet, CSV, a save_to_disk folder (its splits), a dataset
folder of files; nested columns by dotted name; messages prompts; field values that keep their JSON types on
the wire to the reward function (typed `values` beside the text `fields`); a bad row set aside when drawn."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import pytest

from rljob.v1 import sample_pb2
from rljob_api import RLJobInvalid, parse_rljob
from rljob_workers.common.field_values import from_value, sample_fields, to_texts, to_values
from rljob_workers.driver.controller.data import BadRow, DataError, PromptSource, check_rows, open_rows
from rljob_workers.driver.controller.groups import Sample
from rljob_workers.driver.controller.messages import reward_request

from conftest import REPO


def verl_rows(count: int) -> list[dict[str, Any]]:
    """Rows as verl's data keeps them: the prompt as chat messages, the answer inside reward_model."""
    return [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": f"{i}+{i}"}],
            "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
            "extra_info": {"index": i, "split": "train", "tags": ["sum", "small"]},
        }
        for i in range(count)
    ]


FIELDS = ["data_source", "reward_model.ground_truth", "extra_info"]


def _first(path: Path, tmp_path: Path, split: str = "train", **kwargs: Any) -> Any:
    rows = open_rows(path, "prompt", FIELDS, "prompt", split=split, cache_dir=tmp_path / "cache", **kwargs)
    return len(rows), rows[3]


def test_parquet_json_csv_and_saved_datasets_read_alike(tmp_path: Path) -> None:
    table = datasets.Dataset.from_list(verl_rows(8))
    table.to_parquet(str(tmp_path / "d.parquet"))
    table.to_json(str(tmp_path / "d.jsonl"))
    (tmp_path / "d.json").write_text(json.dumps(verl_rows(8)))
    datasets.DatasetDict({"train": table, "test": table.select(range(5))}).save_to_disk(str(tmp_path / "saved"))
    folder = tmp_path / "folder"
    folder.mkdir()
    table.to_parquet(str(folder / "train.parquet"))
    table.select(range(6)).to_parquet(str(folder / "test.parquet"))
    expected = {
        "data_source": "arithmetic",
        "reward_model.ground_truth": "6",
        "extra_info": {"index": 3, "split": "train", "tags": ["sum", "small"]},
    }
    for path in ("d.parquet", "d.jsonl", "d.json", "saved", "folder"):
        count, row = _first(tmp_path / path, tmp_path)
        assert count == 8 and row.messages == ({"role": "user", "content": "3+3"},), path
        assert row.fields == expected, path
    assert _first(tmp_path / "saved", tmp_path, split="test")[0] == 5
    assert _first(tmp_path / "folder", tmp_path, split="test")[0] == 6
    with pytest.raises(DataError, match="no split 'validation'; it has train, test"):
        _first(tmp_path / "saved", tmp_path, split="validation")
    csv = tmp_path / "d.csv"
    csv.write_text("prompt,answer\n1+1=,2\n2+2=,4\n")
    rows = open_rows(csv, "prompt", ["answer"], cache_dir=tmp_path / "cache")
    assert (rows[1].text, rows[1].fields) == ("2+2=", {"answer": 4})  # CSV's own type inference


def test_a_missing_column_is_named_up_front_and_a_bad_row_when_drawn(tmp_path: Path) -> None:
    rows = verl_rows(4)
    rows[2]["prompt"] = "not messages"  # pyarrow would refuse mixed types: this goes in as JSON lines
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"d.jsonl: missing field\(s\) reward_model.answer \(its columns: "):
        open_rows(path, "prompt", ["reward_model.answer"], "prompt", cache_dir=tmp_path / "cache")
    with pytest.raises(DataError, match=r"d.jsonl:3: field prompt is a str, not a list of \{role, content\}"):
        check_rows(path, "prompt", FIELDS, "prompt", split="train", rows=100)
    parquet = tmp_path / "d.parquet"
    good = verl_rows(4)
    del good[1]["extra_info"]["tags"]  # a sparse struct column: null in the rows without it
    datasets.Dataset.from_list(good).to_parquet(str(parquet))
    source = PromptSource(
        open_rows(parquet, "prompt", ["extra_info.tags"], "prompt", cache_dir=tmp_path / "c"), 0, False
    )
    assert [source.next().fields["extra_info.tags"] for _ in range(2)] == [["sum", "small"], None]


def test_a_row_that_makes_no_prompt_is_passed_over_when_drawn(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"prompt": "1+1=", "answer": "2"}\n{"prompt": null, "answer": "4"}\n{"prompt": "3+3=", "answer": "6"}\n'
    )
    source = PromptSource(open_rows(path, "prompt", ["answer"], cache_dir=tmp_path / "cache"), seed=0, shuffle=False)
    assert source.next().prompt_id == "e0-0"
    with pytest.raises(BadRow) as bad:
        source.next()
    assert bad.value.prompt_id == "e0-1" and "d.jsonl:2: field prompt is null, not text" in str(bad.value)
    assert source.next().prompt_id == "e0-2" and sorted(source.pending) == ["e0-0", "e0-2"]


def test_field_values_keep_their_types_on_the_wire_and_at_the_function() -> None:
    fields = {"reward_model.ground_truth": "6", "extra_info": {"index": 3, "tags": ["a"]}, "weight": 0.5, "n": 7}
    sample = Sample("s0", "p0", 0, [1], [2], [0.0], 0, "6")
    from rljob_workers.driver.controller.data import Prompt

    request = reward_request(Prompt("p0", "3+3=", fields), sample)
    wire = sample_pb2.RewardSample.FromString(request.SerializeToString())
    assert dict(wire.fields) == {
        "ground_truth": "6",
        "extra_info": '{"index": 3, "tags": ["a"]}',
        "weight": "0.5",
        "n": "7",
    }
    typed = sample_fields(wire.values, wire.fields)
    assert typed == {"ground_truth": "6", "extra_info": {"index": 3, "tags": ["a"]}, "weight": 0.5, "n": 7}
    assert isinstance(typed["n"], int) and isinstance(typed["weight"], float)
    assert sample_fields({}, {"answer": "2"}) == {"answer": "2"}  # a sender of text only
    assert from_value(to_values({"x": [1, 2.5, None]})["x"]) == [1, 2.5, None]
    assert to_texts({"a.b": True}) == {"b": "true"}


def test_two_fields_that_would_reach_functions_by_one_name_are_refused() -> None:
    import yaml

    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"]["data"]["fields"] = ["answer", "reward_model.answer"]
    with pytest.raises(RLJobInvalid, match=r"spec\.data\.fields: answer and reward_model\.answer both reach functions"):
        parse_rljob(doc)
