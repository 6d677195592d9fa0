"""The command line freezes its long-lived heap at start-up (pacs_fast/gc_heap.py); a library call does not.

``python -m pacs_fast.train`` (run here as the command line runs it: ``runpy`` as ``__main__``) must have
frozen the imports before the learner is built, and the learner's model before the engine is built, so
that the collections of an engine's start (vLLM's) walk neither, and the engine before the loop; an
object made after the last freeze is still tracked (the check tells the two apart). Called as a library
(``trainer.train(cfg)`` in this test process) nothing is frozen or unfrozen: the caller's heap may hold
its own cyclic garbage, or its own freeze. The CPU it saves is measured in bench/bench_startup.py, not
asserted here.
"""
import gc
import json
import subprocess
import sys

from pacs_fast.gc_heap import freeze_long_lived

TINY = ["data.arith_ops=+", "data.arith_max_digits=1", "data.eval_size=2", "rollout.n=2", "rollout.eval_n=1",
        "rollout.max_new_tokens=4", "train.prompts_per_step=2", "learner.mini_batch_prompts=2",
        "learner.micro_batch_prompts=1", "warmup.steps=5", "warmup.batch_size=8", "model.tiny_hidden_size=32",
        "model.tiny_num_layers=1", "train.progress=false", "train.plots=false", "train.tensorboard=false",
        "train.steps=1", "train.eval_every=0", "train.save_every=0"]

PROBE = r"""
import gc, json, runpy, sys
import pacs_fast.trainer.loop as loop
import pacs_fast.trainer.session as session

seen = {}
real_learner, real_engine = session.build_learner, session.build_engine

def tracked(obj):  # in a generation a collection walks (a frozen object is in none of them)
    return any(o is obj for o in gc.get_objects())

def build_learner(cfg, model_path, device, tokenizer, *a, **k):
    seen["frozen_before_learner"] = gc.get_freeze_count()
    seen["tokenizer_tracked"] = tracked(tokenizer)
    return real_learner(cfg, model_path, device, tokenizer, *a, **k)

def build_engine(cfg, model_path, learner, live_model, *a, **k):
    seen["frozen_before_engine"] = gc.get_freeze_count()
    seen["model_tracked"] = tracked(live_model)
    fresh = [["made after the freeze"]]  # (a dict of strings alone is never tracked; a list always is)
    seen["fresh_tracked"] = tracked(fresh)
    return real_engine(cfg, model_path, learner, live_model, *a, **k)

real_step = loop.rollout_step

def rollout_step(*a, **k):
    seen.setdefault("frozen_in_loop", gc.get_freeze_count())
    return real_step(*a, **k)

session.build_learner, session.build_engine, loop.rollout_step = build_learner, build_engine, rollout_step
sys.argv = ["pacs_fast.train", *sys.argv[1:]]
runpy.run_module("pacs_fast.train", run_name="__main__")
print("RESULT " + json.dumps(seen))
"""


def test_the_command_line_freezes_the_imports_and_the_model_before_the_engine(tmp_path):
    args = TINY + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={tmp_path / 'cache'}"]
    out = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.split("RESULT ", 1)[1])
    print(seen)
    assert seen["frozen_before_learner"] > 100_000  # torch and transformers (~470,000 with megatron and vLLM)
    assert not seen["tokenizer_tracked"] and not seen["model_tracked"]
    assert seen["frozen_before_engine"] > seen["frozen_before_learner"]  # the model's modules and parameters
    assert seen["fresh_tracked"]  # the check sees an object made after the freeze
    assert seen["frozen_in_loop"] > seen["frozen_before_engine"]  # the engine and the step-0 evaluation's state


def test_a_library_call_freezes_nothing(tmp_path, monkeypatch):
    """Nor does it unfreeze what the caller froze: the loop used to gc.freeze() at its start and gc.unfreeze()
    at its end in every process (review of 2026-12-03), which emptied a caller's own freeze."""
    import pacs_fast.trainer.loop as loop
    from pacs_fast.config import load_config
    from pacs_fast.trainer import train

    gc.freeze()  # the caller's own freeze (a notebook that froze its imports)
    try:
        before = gc.get_freeze_count()
        assert before > 0
        freeze_long_lived()  # no command line owns this process: nothing more frozen (frozen objects may die)
        assert gc.get_freeze_count() <= before
        during, real_step = [], loop.rollout_step
        monkeypatch.setattr(loop, "rollout_step",
                            lambda *a, **k: during.append(gc.get_freeze_count()) or real_step(*a, **k))
        cfg = load_config(None, TINY + [f"train.out_dir={tmp_path}", f"warmup.cache_dir={tmp_path / 'cache'}"])
        train(cfg, tmp_path / "run")
        # One step, nothing new frozen in it (frozen objects still die by reference count: the count may fall),
        # and the caller's freeze still there afterwards (the old loop's unfreeze left 0).
        assert len(during) == 1 and during[0] <= before, (during, before)
        assert 0.9 * before < gc.get_freeze_count() <= before
    finally:
        gc.unfreeze()


def test_cyclic_garbage_is_collected_before_the_freeze():
    """A freeze keeps whatever the collector tracks, unreachable cycles included, until the process ends (a
    model loader's cycle holding tensors would be memory lost for the run): freeze_long_lived collects first,
    as vLLM's freeze_gc_heap does (review of 2026-11-28). In a fresh process: freezing this one would keep
    pytest's heap."""
    probe = ("import gc, weakref\n"
             "from pacs_fast import gc_heap\n"
             "gc_heap.freeze_at_start_up()\n"
             "class Node: pass\n"
             "n = Node(); n.cycle = n; alive = weakref.ref(n); del n\n"
             "gc.disable()  # (no automatic collection in between: only the freeze's own)\n"
             "gc_heap.freeze_long_lived()\n"
             "print('COLLECTED', alive() is None, gc.get_freeze_count() > 0)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split("COLLECTED ", 1)[1].split() == ["True", "True"]
