"""A dataset folder or glob of numbered shards that lacks one (``train-00000-of-00003`` and ``train-00002-of-00003``,
no ``train-00001``: an interrupted or partial ``huggingface-cli download``) was read as the whole dataset: eval's
``--benchmarks`` (and the trainer's ``data.dataset``) evaluated the rows of the shards present, without a word
(sweep of the eval CLI). It is refused, naming the folder and the missing shard, before any model loads."""
import json
from argparse import Namespace

import pytest

from pacs_fast.config.dataset_files import dataset_files
from pacs_fast.data.datasets import load_dataset
from pacs_fast.evaluation.args import UsageError, load_benchmarks


def _shard(path, start, n=2):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"problem": f"{i}+1=", "answer": str(i + 1)}) + "\n"
                            for i in range(start, start + n)))


def _args():
    return Namespace(limit=None, problem_field="problem", answer_field="answer", extraction="reference",
                     time_limit=5.0)


def test_a_folder_missing_a_shard_is_refused_naming_it(tmp_path):
    data = tmp_path / "aimex" / "data"
    _shard(data / "test-00000-of-00003.jsonl", 0)
    _shard(data / "test-00002-of-00003.jsonl", 4)
    for spec in (data, f"{data}/test-*.jsonl"):
        with pytest.raises(ValueError, match=r"lacks shards of a set of 3 \(test-00001-of-00003\.jsonl"):
            dataset_files(spec)
        with pytest.raises(ValueError, match="test-00001-of-00003.jsonl"):
            load_dataset(spec)
        with pytest.raises(UsageError, match=r"aimex/data.*test-00001-of-00003\.jsonl.*interrupted or partial"):
            load_benchmarks(str(spec), _args())
    _shard(data / "test-00001-of-00003.jsonl", 2)  # the download completed: every row, in order
    sets, _ = load_benchmarks(str(data), _args())
    assert [p.answer for p in sets["aimex"]] == [str(i + 1) for i in range(6)]


def test_a_glob_or_file_that_names_some_shards_is_taken(tmp_path):
    data = tmp_path / "ds"
    for i in range(4):
        _shard(data / f"train-{i:05d}-of-00004.jsonl", 2 * i)
    (data / "train-00003-of-00004.jsonl").unlink()
    assert len(load_dataset(data / "train-00000-of-00004.jsonl")) == 2  # one shard, given by its name
    assert len(load_dataset(f"{data}/train-0000[01]-of-00004.jsonl")) == 4  # the glob asks for two of four
    with pytest.raises(ValueError, match="train-00003-of-00004.jsonl"):
        load_dataset(f"{data}/train-*.jsonl")


def test_hub_hashed_names_and_other_numberings(tmp_path):
    hashed = tmp_path / "hashed"  # the hub's older names: a hash after the count
    _shard(hashed / "train-00000-of-00002-243207c6c994e1bd.jsonl", 0)
    with pytest.raises(ValueError, match=r"train-00001-of-00002-\*\.jsonl"):
        dataset_files(hashed)
    _shard(hashed / "train-00001-of-00002-9f0e1d2c3b4a5968.jsonl", 2)
    assert len(dataset_files(hashed)) == 2
    one_based = tmp_path / "one_based"  # numbered 1..n: not the hub's naming, not checked
    _shard(one_based / "part-1-of-2.jsonl", 0)
    _shard(one_based / "part-2-of-2.jsonl", 2)
    assert len(load_dataset(one_based)) == 4
    arrow_like = tmp_path / "single"  # a set of one shard, complete
    _shard(arrow_like / "data-00000-of-00001.jsonl", 0)
    assert len(load_dataset(arrow_like)) == 2
