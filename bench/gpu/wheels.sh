#!/usr/bin/env bash
# Wheels for a GPU machine without network (docs/GPU.md): what the GPU suite's product runs need and a
# stock PyTorch image lacks, at the versions of requirements/ci.lock, for CPython 3.12 on x86-64.
#
#   bash bench/gpu/wheels.sh [DIR]        # here, with network; DIR defaults to .whl (git-ignored)
#
# Then, on the GPU machine, before the suite:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site DIR/*.whl && export PYTHONPATH=/tmp/site
# megatron-core (the megatron learner at TP=1), trl + datasets (the TRL adapter), math-verify (the
# verifier), liger-kernel. vLLM is not among them (too large to carry): the suite says so and uses the HF engine.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
  -*) echo "usage: bash bench/gpu/wheels.sh [DIR]" >&2; exit 2;;
esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${1:-$ROOT/.whl}"
LOCK="$ROOT/requirements/ci.lock"
NAMES=(megatron-core trl datasets dill multiprocess math-verify latex2sympy2-extended antlr4-python3-runtime)
PINS=()
for n in "${NAMES[@]}"; do
  pin=$(grep -i "^$n==" "$LOCK" || true)
  [[ -n "$pin" ]] || { echo "bench/gpu/wheels.sh: $n is not in $LOCK" >&2; exit 2; }
  PINS+=("${pin%% *}")
done
# liger-kernel (not in the lock: the comparison in bench/gpu/logprobs.py and learner.fused_layers=on), the
# version bench/README.md's tables were measured with
PINS+=("liger-kernel==0.8.5")
# cut-cross-entropy (Apple's; the `cce` comparison in bench/gpu/logprobs.py), a 22 KB wheel
PINS+=("cut-cross-entropy==25.1.1")
mkdir -p "$DIR"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DIR" "${PINS[@]}"
ls -1 "$DIR"
du -sh "$DIR"
