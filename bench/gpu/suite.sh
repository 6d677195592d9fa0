#!/usr/bin/env bash
# One-command GPU validation of pacs_fast (docs/GPU.md):
#
#   bash bench/gpu/suite.sh OUT_DIR            # on a CUDA machine; < 9 minutes on one H100
#   bash bench/gpu/suite.sh OUT_DIR --dry-run  # on CPU: tiny shapes, checks the suite's own plumbing
#
# Runs every `pytest -m gpu` test, the ahead-of-time compile table, the log-prob benchmark
# (N=8192, H=4096, V=151,936, bf16, fwd+bwd with entropy), the fused PACS loss vs torch
# (B=1024, T=4096) and a 20-step PACS run (vLLM rollouts, random Qwen2.5-0.5B-shaped model);
# writes OUT_DIR/gpu_report.md and OUT_DIR/gpu_report.json. Exits non-zero, with a
# "GPU SUITE FAILED" line, when anything did not run (on the GPU).
set -euo pipefail
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: bash bench/gpu/suite.sh OUT_DIR [--dry-run] [--budget-s S] [--steps a,b,...]" >&2
  exit 2
fi
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY="${PYTHON:-python}"
if [[ -z "${PYTHON:-}" && -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; fi
# Wheels brought along for a machine without network (bash bench/gpu/wheels.sh): megatron-core, trl, ...
if compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/pacs_fast_site \
    "$ROOT"/.whl/*.whl && export PYTHONPATH="/tmp/pacs_fast_site${PYTHONPATH:+:$PYTHONPATH}"
fi
exec "$PY" "$HERE/suite.py" "$@"
