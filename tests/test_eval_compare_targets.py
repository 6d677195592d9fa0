"""``python -m pacs_fast.eval compare ... --table DIR/samples_amc23.jsonl`` (a slip of the shell's completion in an
eval folder) replaced the samples file, hours of sampling, with the markdown table, and returned 0; only the results
files compared were guarded (sweep of the eval CLI). A samples, settings or results file of an eval folder is refused
as ``--table`` or ``--out``, in one line, before anything is written."""
import json

import pytest

from pacs_fast import eval as ev


@pytest.fixture
def folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    recs = [{"benchmark": "amc23", "index": i, "id": str(i), "answer": "1", "n": 2, "scores": [1.0, 0.0],
             "statuses": ["ok", "ok"]} for i in range(3)]
    (run / "samples_amc23.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert ev.main(["report", "--out", str(run)]) == 0
    (run / "run_config.json").write_text("{}\n")
    return run


@pytest.mark.parametrize("flag", ["--table", "--out"])
@pytest.mark.parametrize("name", ["samples_amc23.jsonl", "run_config.json", "other/results.json"])
def test_compare_never_writes_over_an_eval_folders_files(folder, tmp_path, capsys, flag, name):
    other = tmp_path / "other"  # another eval folder's results.json, not among those compared
    other.mkdir(exist_ok=True)
    (other / "results.json").write_text((folder / "results.json").read_text())
    target = tmp_path / name if name.startswith("other/") else folder / name
    before = target.read_bytes()
    paths = {"--table": str(tmp_path / "t.md"), "--out": str(tmp_path / "p.png"), flag: str(target)}
    capsys.readouterr()
    assert ev.main(["compare", str(folder), "--out", paths["--out"], "--table", paths["--table"]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} {target} is an eval folder's {target.name}" in err
    assert target.read_bytes() == before
    assert not (tmp_path / "t.md").exists() and not (tmp_path / "p.png").exists()


def test_compare_still_writes_new_and_own_files(folder, tmp_path):
    table = tmp_path / "table.md"
    table.write_text("old\n")  # a table of an earlier compare is replaced, as before
    assert ev.main(["compare", str(folder), "--out", str(tmp_path / "p.png"), "--table", str(table)]) == 0
    assert "AMC23 pass@1" in table.read_text() and (tmp_path / "p.png").stat().st_size > 1000
