"""A stop right after a checkpoint is published keeps its ``checkpoint`` record (kill/resume sweep of 2026-11-30).

The record was appended to ``metrics.jsonl`` after ``save_checkpoint`` had renamed the checkpoint into place: a
SIGKILL between the two (2 of 6 tries in the sweep) left ``step_000004`` on disk without its record, and the
resume, which redoes only the steps after the checkpoint, never wrote it: ``read_jsonl`` lacked
``("checkpoint", 4)`` against an uninterrupted run. Now the record is written just before the rename; a stop
before the rename leaves a record that the resume from the older checkpoint supersedes.
"""
import pytest

from pacs_fast.trainer.metrics import read_jsonl

from test_train import TINY


class Stopped(BaseException):
    """Stands for a SIGKILL right after the checkpoint's rename (nothing after it runs)."""


def test_a_stop_right_after_a_checkpoint_keeps_its_record(tmp_path, monkeypatch, warm_cache):
    from pacs_fast.train import main
    from pacs_fast.trainer import loop

    real = loop.save_checkpoint

    def save_then_stop(run_dir, step, **kw):
        out = real(run_dir, step, **kw)
        if step == 2:
            raise Stopped
        return out

    monkeypatch.setattr(loop, "save_checkpoint", save_then_stop)
    common = TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.steps=3",
                     "train.save_every=2", "train.eval_every=0", "train.plots=false"]
    with pytest.raises(Stopped):
        main(common + ["train.run_name=r"])
    run = tmp_path / "r"
    assert (run / "checkpoints" / "step_000002").is_dir()
    assert ("checkpoint", 2) in [(r["kind"], r["step"]) for r in read_jsonl(run / "metrics.jsonl")]
    monkeypatch.setattr(loop, "save_checkpoint", real)
    main(["--resume", str(run)])
    kinds = [(r["kind"], r["step"]) for r in read_jsonl(run / "metrics.jsonl")]
    assert kinds.count(("checkpoint", 2)) == 1 and ("train", 3) in kinds


def test_the_records_reach_the_disk_before_their_checkpoint_is_published(tmp_path, monkeypatch, warm_cache):
    """metrics.jsonl and samples.jsonl were flushed, never fsynced, while the checkpoint after them is fsynced and
    renamed into place: after a power cut the checkpoint could outlive its records, and a resume from it (which redoes
    only later steps) left a gap nothing reported. Each checkpoint's rename now comes after both files' fsync (the
    order of the calls is what is checked: no test here can cut the power)."""
    import os

    from pacs_fast.train import main

    events, real_fsync, real_replace = [], os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    def replace(src, dst, **kw):
        events.append(("replace", os.path.basename(str(dst))))
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    main(TINY + [f"warmup.cache_dir={warm_cache}", f"train.out_dir={tmp_path}", "train.steps=4", "train.save_every=2",
                 "train.eval_every=0", "train.plots=false", "train.log_samples=2", "train.run_name=r"])
    published = [i for i, e in enumerate(events) if e[0] == "replace" and e[1].startswith("step_")]
    assert [events[i][1] for i in published] == ["step_000002", "step_000004"], events
    last = 0
    for i in published:  # between the previous publish and this one: both files put on the disk
        synced = {name for kind, name in events[last:i] if kind == "fsync"}
        assert {"metrics.jsonl", "samples.jsonl"} <= synced, (events[i], events[last:i])
        last = i
