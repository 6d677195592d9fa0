"""A dataset as a folder or glob of shards (pacs_fast/config/dataset_files.py): what a hub download
(``huggingface-cli download --repo-type dataset``) and ``Dataset.save_to_disk`` leave on disk.

Before this, ``data.dataset`` and eval's ``--benchmarks`` took one file only: a hub download's folder was
"not an existing file", and its shards had to be joined by hand. A folder that holds more than one set of
rows (a train and a test split, two subsets) is refused with what to give instead: reading both would
train on the test split, or mix the subsets, without a word.
"""
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pacs_fast.config.dataset_files import dataset_exists, dataset_files
from pacs_fast.data.datasets import load_dataset


def _rows(start, n, split="train"):
    return [{"problem": f"{split} {i}+1=", "answer": i + 1} for i in range(start, start + n)]


def _parquet(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2)  # several row groups: read in batches


def _hub_download(root):
    """The layout of a hub dataset downloaded with --local-dir: two train shards and a test shard in data/."""
    _parquet(root / "data" / "train-00000-of-00002.parquet", _rows(0, 3))
    _parquet(root / "data" / "train-00001-of-00002.parquet", _rows(3, 4))
    _parquet(root / "data" / "test-00000-of-00001.parquet", _rows(0, 2, "test"))
    (root / "README.md").write_text("---\nconfigs: []\n---\n")
    (root / ".gitattributes").write_text("*.parquet filter=lfs\n")
    (root / ".cache" / "huggingface").mkdir(parents=True)
    (root / ".cache" / "huggingface" / "download.json").write_text("{}")  # the hub client's metadata: not rows
    return root


def test_a_hub_download_with_two_splits_is_refused_naming_the_glob_to_give(tmp_path):
    root = _hub_download(tmp_path / "ds")
    data = str(root / "data")
    with pytest.raises(ValueError, match=rf"several splits \(test, train\); give one split's files: '{data}/test\*"
                                         rf"\.parquet' or '{data}/train\*\.parquet'$"):
        load_dataset(root)
    got = load_dataset(f"{root}/data/train*.parquet")  # the glob the message names
    assert [p.problem for p in got] == [r["problem"] for r in _rows(0, 7)]  # shard 0, then shard 1, in order
    assert [p.id for p in got] == [str(i) for i in range(7)]  # ids run on across the shards
    assert [p.answer for p in got] == [str(i + 1) for i in range(7)]
    assert "row 2" in _where_of_bad_row(root)


def _where_of_bad_row(root):
    """The error for a bad row in the second shard names that shard and its row."""
    _parquet(root / "bad" / "train-00000-of-00002.parquet", _rows(0, 1))
    _parquet(root / "bad" / "train-00001-of-00002.parquet",
             [{"problem": "x", "answer": 1}, {"problem": "", "answer": 2}])
    with pytest.raises(ValueError) as e:
        load_dataset(root / "bad")
    assert "train-00001-of-00002.parquet" in str(e.value)
    return str(e.value)


def test_one_split_in_a_folder_reads_every_shard(tmp_path):
    root = tmp_path / "ds"
    _parquet(root / "data" / "train-00000-of-00002.parquet", _rows(0, 2))
    _parquet(root / "data" / "train-00001-of-00002.parquet", _rows(2, 3))
    assert [p.problem for p in load_dataset(root)] == [r["problem"] for r in _rows(0, 5)]
    assert dataset_files(root) == sorted((root / "data").glob("*.parquet"))


def test_subsets_and_mixed_formats_are_refused(tmp_path):
    gsm = tmp_path / "gsm8k"  # GSM8K's layout: one folder per subset
    for subset in ("main", "socratic"):
        _parquet(gsm / subset / "train-00000-of-00001.parquet", _rows(0, 2))
    with pytest.raises(ValueError, match=r"several folders \(main/, socratic/\).*give one folder"):
        load_dataset(gsm)
    assert len(load_dataset(gsm / "main")) == 2
    with pytest.raises(ValueError, match="several folders"):  # a glob across both subsets as well
        load_dataset(f"{gsm}/*/train-*.parquet")
    named = tmp_path / "named"  # a test split beside a file that names no split: reading both mixes them
    _parquet(named / "problems.parquet", _rows(0, 2))
    _parquet(named / "test.parquet", _rows(0, 1, "test"))
    with pytest.raises(ValueError, match=rf"several splits \(test and files that name none, such as "
                                         rf"problems\.parquet\); give one split's files: '{named}/test\*\.parquet' "
                                         rf"or {named}/problems\.parquet$"):
        load_dataset(named)
    assert len(load_dataset(named / "problems.parquet")) == 2
    mixed = tmp_path / "mixed"
    _parquet(mixed / "a.parquet", _rows(0, 1))
    (mixed / "b.jsonl").write_text(json.dumps(_rows(1, 1)[0]) + "\n")
    with pytest.raises(ValueError, match=r"several formats \(\.jsonl, \.parquet\)"):
        load_dataset(mixed)


def test_save_to_disk_folders_load_and_a_dataset_dict_names_its_split(tmp_path):
    datasets = pytest.importorskip("datasets", reason="datasets is in requirements/ci.lock; a bare install lacks it")
    rows = _rows(0, 5)
    one = tmp_path / "one"
    datasets.Dataset.from_list(rows).save_to_disk(str(one), num_shards=2)
    assert len(list(one.glob("*.arrow"))) == 2 and (one / "state.json").is_file()
    got = load_dataset(one)
    assert [(p.problem, p.answer) for p in got] == [(r["problem"], str(r["answer"])) for r in rows]
    both = tmp_path / "dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows),
                          "test": datasets.Dataset.from_list(_rows(0, 2, "test"))}).save_to_disk(str(both))
    with pytest.raises(ValueError, match=rf"several splits \(test, train\); give one split's files: {both}/test or "
                                         rf"{both}/train$"):
        load_dataset(both)
    assert [p.problem for p in load_dataset(both / "train")] == [r["problem"] for r in rows]


def test_an_arrow_file_is_read_as_a_stream_or_a_file(tmp_path):
    """save_to_disk writes Arrow IPC streams; an Arrow IPC file (``pa.ipc.new_file``) is read too."""
    table = pa.Table.from_pylist(_rows(0, 3))
    for name, writer in (("stream.arrow", pa.ipc.new_stream), ("file.arrow", pa.ipc.new_file)):
        path = tmp_path / name
        with pa.OSFile(str(path), "wb") as sink, writer(sink, table.schema) as w:
            w.write_table(table, max_chunksize=2)
        assert [p.problem for p in load_dataset(path)] == [r["problem"] for r in _rows(0, 3)]


def test_nothing_there_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.md").write_text("x")
    with pytest.raises(FileNotFoundError, match="holds no data file"):
        load_dataset(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="no dataset file matches"):
        load_dataset(f"{tmp_path}/*.parquet")
    with pytest.raises(FileNotFoundError, match="huggingface-cli download --repo-type dataset "
                                                "BytedTsinghua-SIA/DAPO-Math-17k --local-dir DIR"):
        load_dataset("BytedTsinghua-SIA/DAPO-Math-17k")  # a hub id, not a path here
    assert not dataset_exists(f"{tmp_path}/*.parquet") and dataset_exists(tmp_path / "empty")


def test_the_trainer_takes_a_folder_and_refuses_two_splits_before_loading(tmp_path, monkeypatch):
    from pacs_fast.config import load_config, validate
    from pacs_fast.data.tiny import make_tiny_model
    from pacs_fast.trainer.problems import load_problems
    from pacs_fast.trainer.run_folder import _gone, record_absolute_paths

    root = _hub_download(tmp_path / "ds")
    base = [f"model.path={make_tiny_model(tmp_path / 'model')}", f"train.out_dir={tmp_path / 'runs'}"]
    cfg = load_config(None, base + [f"data.dataset={root}"])
    with pytest.raises(ValueError, match=r"^data\.dataset: dataset folder .* holds several splits"):
        validate(cfg, world=1)
    cfg = load_config(None, base + [f"data.dataset={root}/data/train-*.parquet",
                                    f"data.eval_dataset={root}/data/test-00000-of-00001.parquet"])
    validate(cfg, world=1)
    train, held = load_problems(cfg)
    assert len(train) == 7 and [p["problem"] for p in held] == ["test 0+1=", "test 1+1="]
    monkeypatch.chdir(root)  # a relative glob is recorded whole when it matches, kept as given when not
    cfg.data.dataset = "data/train-*.parquet"
    record_absolute_paths(cfg)
    assert cfg.data.dataset == f"{root}/data/train-*.parquet"
    cfg.data.eval_dataset = "data/*.nothing"
    record_absolute_paths(cfg)
    assert cfg.data.eval_dataset == "data/*.nothing"
    assert not _gone(cfg.data.dataset)
    for f in (root / "data").glob("train-*"):
        f.unlink()
    assert _gone(cfg.data.dataset)  # a resume says the data is gone and asks for its new place


def test_eval_takes_a_hub_folder_under_its_name(tmp_path):
    from argparse import Namespace

    from pacs_fast.evaluation.args import UsageError, benchmark_name, load_benchmarks

    root = _hub_download(tmp_path / "aime25")
    args = Namespace(limit=None, problem_field="problem", answer_field="answer", extraction="reference",
                     time_limit=5.0)
    sets, sources = load_benchmarks(f"{root}/data/test-*.parquet", args)
    assert list(sets) == ["aime25"] and len(sets["aime25"]) == 2
    assert benchmark_name(root / "data") == "aime25"
    assert benchmark_name(root / "data" / "train-00000-of-00002.parquet") == "train-00000-of-00002"
    with pytest.raises(UsageError, match="several splits"):
        load_benchmarks(str(root), args)
    shipped = tmp_path / "math500"
    _parquet(shipped / "data" / "test-00000-of-00001.parquet", _rows(0, 1))
    with pytest.raises(UsageError, match="the folder's name 'math500' is a shipped benchmark's; rename the folder"):
        load_benchmarks(str(shipped), args)


def test_relative_paths_links_and_names_from_the_review(tmp_path, monkeypatch):
    """Review of 2026-11-28: a relative glob run from ``proj[v2]/`` was recorded with ``[v2]`` unescaped (then
    refused: it matched nothing); eval filed ``data/test-*.parquet`` typed inside a hub download under
    ``test-*`` and ``.`` under ``''``; a linked data folder was "no data file"; the hub hint named local paths;
    test.jsonl and eval.jsonl were one split."""
    from pacs_fast.config import load_config
    from pacs_fast.config.dataset_files import absolute_spec
    from pacs_fast.evaluation.args import benchmark_name
    from pacs_fast.trainer.run_folder import record_absolute_paths

    proj = tmp_path / "proj[v2]"
    _hub_download(proj / "aime25")
    monkeypatch.chdir(proj / "aime25")
    cfg = load_config(None, ["data.dataset=data/train-*.parquet"])
    record_absolute_paths(cfg)
    assert cfg.data.dataset == absolute_spec("data/train-*.parquet") and "proj[[]v2]" in cfg.data.dataset
    assert len(load_dataset(cfg.data.dataset)) == 7  # the recorded glob still reads the same files
    for typed in ("data/test-*.parquet", "data", "."):
        assert benchmark_name(Path(typed)) == "aime25", typed
    monkeypatch.setenv("HOME", str(proj))
    assert absolute_spec("~/aime25/data/train-*.parquet") == cfg.data.dataset
    assert len(load_dataset("~/aime25/data/train-*.parquet")) == 7

    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "data").symlink_to(proj / "aime25" / "data" / ".." / "data")
    (proj / "aime25" / "data" / "loop").symlink_to(proj / "aime25")  # a link back up: searched once, no hang
    with pytest.raises(ValueError, match="several splits"):  # found through the link (was "holds no data file")
        load_dataset(linked)

    with pytest.raises(FileNotFoundError) as e:
        load_dataset("data/missing.jsonl")
    assert "huggingface-cli" not in str(e.value)
    two = tmp_path / "two"
    two.mkdir()
    for name in ("test.jsonl", "eval.jsonl"):
        (two / name).write_text(json.dumps(_rows(0, 1)[0]) + "\n")
    with pytest.raises(ValueError, match=r"several splits \(eval, test\)"):
        load_dataset(two)
    parts = tmp_path / "parts"  # a split beside several files that name none: no glob takes only them
    _parquet(parts / "test.parquet", _rows(0, 1))
    for i in range(3):
        _parquet(parts / f"part-{i}.parquet", _rows(i, 1))
    with pytest.raises(ValueError, match="or a folder holding only the 3 files that name no split$"):
        load_dataset(parts)


def test_json_lines_in_a_json_file_split_at_newlines_only(tmp_path):
    """U+2028 / U+0085 inside a string are JSON text, not line ends (str.splitlines split there); a one-row
    ``Dataset.to_json`` file is one object on one line (it was "must hold a list of objects")."""
    rows = [{"problem": "a\u2028b\u0085c", "answer": "1"}, {"problem": "d", "answer": "2"}]
    path = tmp_path / "lines.json"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert [p.problem for p in load_dataset(path)] == ["a\u2028b\u0085c", "d"]
    path.write_text(json.dumps(rows[1]) + "\n")
    assert [p.problem for p in load_dataset(path)] == ["d"]
    path.write_text(json.dumps({"problem": "d", "answer": "2"}, indent=1))  # a JSON document of one object
    with pytest.raises(ValueError, match="must hold a list of objects, got dict"):
        load_dataset(path)
