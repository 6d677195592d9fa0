#!/usr/bin/env bash
# The GPU lease script lives in bench/gpu/lease.sh (moved there with the other GPU-machine scripts); this name is kept
# for the instructions that still give it. Same arguments: bash bench/gpu_lease.sh OUT_DIR [mode] (--help: the plan).
exec bash "$(dirname "$0")/gpu/lease.sh" "$@"
