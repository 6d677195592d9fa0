"""A resume reads ``learner.pt`` memory-mapped (pacs_fast/learner/base.py ``load_state``).

``torch.load(map_location="cpu")`` read the whole file into host memory before the optimiser copied each tensor to
its device: AdamW's moments of a 7.6B-parameter policy (61 GB; 91 GB with a bf16 model's fp32 masters) at once, on
top of the model (review of 2026-12-03). Memory-mapped, a tensor's pages are read as it is copied into place; on a
CPU learner the moments stay file-backed until AdamW writes them.
"""
import torch


def _rss_anon() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))


def test_loading_a_learner_state_does_not_read_it_into_anonymous_memory(tmp_path):
    import transformers

    from pacs_fast.config import AlgoConfig, LearnerConfig
    from pacs_fast.data.tiny import tiny_qwen2_config
    from pacs_fast.learner.torch_learner import TorchLearner

    def learner():
        config = tiny_qwen2_config(200_000, hidden_size=128, num_layers=1, intermediate_size=64)
        model = transformers.Qwen2ForCausalLM(config)  # 25.6M embedding parameters: ~200 MB of AdamW moments
        return TorchLearner(model, algo=AlgoConfig(name="pacs"), learner=LearnerConfig(), temperature=1.0, horizon=4)

    saved = learner()
    for p in saved.optimizer.param_groups[0]["params"]:  # the moments of a learner that has stepped
        state = saved.optimizer.state[p]
        state.update(step=torch.tensor(1.0), exp_avg=torch.randn_like(p), exp_avg_sq=torch.rand_like(p))
    saved.save_state(tmp_path, is_writer=True)
    size = (tmp_path / "learner.pt").stat().st_size
    want = {id(p): saved.optimizer.state[p]["exp_avg"].clone() for p in saved.optimizer.param_groups[0]["params"]}
    order = [id(p) for p in saved.optimizer.param_groups[0]["params"]]
    del saved

    fresh = learner()
    before = _rss_anon()
    fresh.load_state(tmp_path)
    grown = _rss_anon() - before
    assert size > 150e6 and grown < 0.3 * size, (grown, size)  # read whole: grown >= size
    for i, p in zip(order, fresh.optimizer.param_groups[0]["params"]):  # and the state is the saved one
        assert torch.equal(fresh.optimizer.state[p]["exp_avg"], want[i])
