"""Crash-consistency sweep of 2026-12-03 (SIGKILL inside writes, a full disk): an eval killed while writing its
reports left ``.results.json.tmp-PID`` / ``.pass_at_k.png.tmp-PID`` in ``--out`` for good (the trainer removes a
killed run's temporaries under its lock; the eval did not); a full disk during an eval was ``error: [Errno 28] No
space left on device`` with the exit status of a bad argument; a trainer on an almost full disk printed its one line,
then the traceback of TensorBoard's writer thread."""
import errno
import threading

from pacs_fast import eval as ev
from pacs_fast import train as tr
from pacs_fast.files import is_temporary, temporary_name

from test_eval_folder import _copy, two_commands  # noqa: F401  (two_commands: a fixture)
from test_eval_hostile import _args, _toy, model_dir  # noqa: F401  (model_dir: a fixture)
from test_run_safety import STEPS, TINY, cache, cli  # noqa: F401  (cache: a fixture)

DEAD_PID = 2**22 + 17  # above pid_max's default: no live process writes these temporaries


def _stale(out):
    """What a kill between an atomic write's fill and its rename leaves (pacs_fast/files.py names them)."""
    found = []
    for name in ("results.json", "pass_at_k.png", "table.md"):
        tmp = out / f".{name}.tmp-{DEAD_PID}"
        assert is_temporary(tmp.name) and is_temporary(temporary_name(out / name).name)  # (the same pattern)
        tmp.write_bytes(b"half a file")
        found.append(tmp)
    return found


def test_a_killed_evals_temporaries_are_removed_by_the_next_command(two_commands, model_dir, tmp_path, capsys):
    out = _copy(two_commands, tmp_path)
    stale = _stale(out)
    assert ev.main(["report", "--out", str(out)]) == 0
    assert not any(p.exists() for p in stale)
    stale = _stale(out)
    assert ev.main(_args(model_dir, two_commands[2], out)) == 0  # (the rerun of a finished command: resumes)
    assert not any(p.exists() for p in stale)
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [".run.lock"]


def test_a_full_disk_in_an_eval_is_one_line_saying_how_to_go_on(model_dir, tmp_path, capsys, monkeypatch):
    data = _toy(tmp_path / "toy.jsonl", n=2)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(ev, "write_reports", full)
    capsys.readouterr()
    assert ev.main(_args(model_dir, data, tmp_path / "run")) == 1  # (not 2: no argument was wrong)
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "no space left on device" in lines[0] and "run the same command again" in lines[0], lines[0]
    assert (tmp_path / "run" / "samples_toy.jsonl").read_text().count("\n") == 2  # kept: the rerun resumes


def test_a_threads_full_disk_error_is_left_to_the_main_threads_line(monkeypatch):
    printed = []  # what the hook before it (Python's, which prints the traceback; pytest's here) was handed
    monkeypatch.setattr(threading, "excepthook", lambda args: printed.append(args.exc_value.errno))
    tr.quiet_full_disk_in_threads()

    def fail(code):
        raise OSError(code, "from a writer thread")
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EACCES):
        t = threading.Thread(target=fail, args=(code,))
        t.start()
        t.join()
    assert printed == [errno.EACCES]  # a full disk: the main thread's one line; any other error as before


def test_a_disk_too_full_for_a_new_runs_config_leaves_no_folder_and_says_run_again(tmp_path, capsys, cache,
                                                                                    monkeypatch):
    """A new run on a full disk failed writing config.yaml: the line said ``continue with --resume RUN``, whose
    resume then failed (no config.yaml there), and the folder stayed behind holding the run's lock alone."""
    from pacs_fast.trainer.run_folder import RunFolder

    def full(self, cfg):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(RunFolder, "write_config", full)
    code, _, err = cli(TINY + STEPS + [f"warmup.cache_dir={cache}", f"train.out_dir={tmp_path}", "train.run_name=r"],
                       capsys)
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert "no space left on device" in errors[0] and "run the same command again" in errors[0], errors[0]
    assert "--resume" not in errors[0], errors[0]
    assert not (tmp_path / "r").exists()  # (a run started afterwards with this name is not refused: the same)


def test_a_new_run_inside_another_runs_folder_is_refused(tmp_path, capsys, cache):
    """A run made in another's checkpoints/ (train.out_dir=RUN/checkpoints) was taken by that run's resume for a
    damaged checkpoint and would be deleted when it wrote that step; with the other run live, its pruning deleted
    the new run's folder under it (a FileNotFoundError traceback). Refused before any model work."""
    outer = tmp_path / "outer"
    (outer / "checkpoints").mkdir(parents=True)
    (outer / "config.yaml").write_text("train: {}\n")
    (outer / ".run.lock").write_text("1\n")
    for where in (["train.out_dir=" + str(outer / "checkpoints"), "train.run_name=step_000099"],
                  ["train.out_dir=" + str(outer)]):  # (an automatic name alike)
        code, _, err = cli(TINY + STEPS + [f"warmup.cache_dir={cache}", *where], capsys)
        assert code == 2 and "is inside the run folder" in err and "Traceback" not in err, err
    assert sorted(p.name for p in outer.rglob("*")) == [".run.lock", "checkpoints", "config.yaml"]
