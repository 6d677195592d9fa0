#!/usr/bin/env bash
# Issue 22's measurements in one device call (a lease is ~15 device-minutes, machine start included):
#
#   bash bench/gpu/lease.sh OUT_DIR [open|extra|main|product|final|learner]     (default: open)
#
# open (the next lease's first call, ~9 minutes; what issues 38 and 39 still lack, most wanted first; from 2026-12-05):
#   1. pacs_tests    the PACS loss's and CUDA-graph gpu tests (the one-pass forward against float64 at real shapes),
#                    then (learner_kernels_test) the trainer's learner on the kernels, its PACS loss fused since
#                    2026-12-05, against the torch paths
#   2. pacs_loss     bench/bench_pacs_loss.py --device cuda: the one-pass forward (default since 2026-12-04, never
#                    timed on a GPU) beside the two passes, device and wall time, a CUDA graph's replay, the copy
#   3. host          bench/gpu/pacs_loss_host_profile.py: the eager call's wall-time ladder (copy, x.sum()'s
#                    autograd, ours without launches, with empty kernels, forward, forward + backward, and each
#                    after 2 ms of queued matmuls) and cProfile
#   4. logprobs      the main shape (8192 x 4096 x 151,936) with the float64 errors of logp / entropy / dh / dW of
#                    the timed launches, raw samples, SM clocks, one shared floor, Liger, cut-cross-entropy and
#                    model.lm_head_fp32's kernels (pacs_triton_upcast); then fp32 inputs (issue 39 item 5)
#   5. shapes        H=896, H=3584 and V=32,000 against their floors with each Triton variant's device time per
#                    kernel (--profile: what holds the small H back)
#   6. attention     bench/gpu/attention.py: flex_attention with a document mask against the varlen kernel and the
#                    split (issue 38's kernel choice)
#   7. learner       the Qwen2.5-0.5B learner rows (torch packed varlen, padded + SDPA, megatron packed THD and
#                    padded), the rest of the call's time
#   Then, at once (a machine stays warm ~30 s after a call; a 15-minute lease has ~3.5 minutes left after open and
#   its start), `extra` on the same machine (EXTRA_TOTAL_S, default 200 s):
#   1. curve         issue 38's memory curve: the fused layers' learner (torch packed varlen + Liger layers, 1.5B
#                    shape, 32k responses, selective recompute) at 17,408 / 34,816 / 66,048 tokens a micro-batch
#                    (52,224 for the last on a GPU under 100 GiB, an H100; CURVE_BUDGETS sets them, CURVE_GPU_GIB
#                    the memory they follow instead of the GPU's; CURVE_S, default 110 s)
#   2. grid          the rest of issue 39's grid (H=8192 x V=128,256, V=128,256 at H=4096, N = 2k / 32k / 64k at the
#                    main shape), the time left
#   Then, on a later lease: `main` without its suite (`MAIN_SKIP_SUITE=1`: the Gluon kernels' check, the tuning at
#   H=4096 and H=896, the tuned table's log-probs at the main and other shapes, then the rest of issue 39's grid:
#   H=8192 and V=128,256, N = 2k, 32k and 64k at the main shape, with TFLOP/s and workspace: extra's grid again, or
#   what it did not reach); `final` if something was changed.
#
# learner (~7 minutes, first): the gpu tests of the varlen attention and of Liger's fused layers, then
#   bench/gpu/learner.py (issue 38): one learner update (log-probs, PACS loss, backward, AdamW), bf16,
#   Qwen2.5-1.5B / 0.5B shapes, packed varlen (with and without learner.fused_layers=on: carry liger-kernel in
#   .whl) vs padded vs dense mask vs megatron packed THD (TP = 1; with and without its Liger SwiGLU), main shape
#   first (1.5B at 4k), 360 s budget (rows not started are listed as such).
# main (one ~9-minute call, the priority order of docs/GPU.md):
#   1. suite   bench/gpu/suite.py --steps env,gpu_tests,logprobs,pacs_loss: the gpu tests, the log-prob
#              kernels against the GEMM floors and Liger, the PACS loss against the copy floor (built-in tables)
#   2. tune    bench/gpu/tune.py on the log-prob forwards and dz kernels (short budget; the finalists timed
#              again at H=896, --also-h), written to kernels/tuned/sm_<arch>.json of this checkout (the PACS
#              loss keeps the table measured before)
#   3. tuned   the log-prob benchmark again, now reading the measured table (with --profile: each Triton
#              variant's device time per kernel, tile kernels against the glue)
#   4. shapes  the log-probs at H=896 (Qwen2.5-0.5B), H=3584 (7B) and V=32,000, against their floors, Liger and
#              cut-cross-entropy, with each Triton variant's device time per kernel (what holds the small H back)
#   The warp-specialised Gluon kernels (kernels/linear_logprobs_gluon.py) join the tuning and phases 3-4
#   only once their float64 check (tests/test_linear_logprobs_gluon.py, in a time-limited subprocess) has
#   passed in this call: a wrong mbarrier protocol hangs rather than fails; their ping-pong launches join
#   the tuning (--pingpong) only where their own check passed too.
# product (a short second call): bench/gpu/suite.py --steps env,compile,megatron_run,trl_run.
# final (after changes made from what main showed): the Gluon kernels' check, the PACS loss (and on .old/,
#   an earlier tree, when present), the log-probs with their alternating floors, the gpu tests, the megatron run.
#   With .old/ (e.g. mkdir .old && git archive a29a09a | tar -x -C .old: the tl.exp epilogues), the default
#   log-prob path of both trees at H=896 and H=4096, each against floors timed in alternation with it.
#
# learner mode checks LEARNER_BUDGET_S and LEARNER_ARGS before its first phase (exit 2 on a mistake); open mode checks
# LEARNER_ARGS (added to its learner phase's arguments) and OPEN_TOTAL_S (default 530: its learner phase's budget is
# what is left of that many seconds from the first phase, at least 60).
# LEASE_CHECK_ONLY=1 (any mode) runs nothing: it checks the python (PYTHON, default python3) imports torch and
# prints each phase's time limit and command line (learner mode: after its settings' check).
# Every mode ends with `targets` (bench/gpu/targets.py on the call's files: each target of issues 38 and 39 this call
# measured, met or not, printed; targets.log / targets.json hold the evidence).
# Every phase is time-limited and independent; after each one OUT_DIR/lease.tgz holds everything so far
# (logs, JSON, the tuned table; never a model or checkpoint), so a call cut off still returns its phases.
# Wheels in .whl/ (bash bench/gpu/wheels.sh; liger-kernel for the comparison) are installed first.
set -uo pipefail
USAGE="usage: bash bench/gpu/lease.sh OUT_DIR [open|extra|main|product|final|learner] (the header of bench/gpu/lease.sh says more)"
case "${1:-}" in
  -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
  ""|-*) echo "$USAGE" >&2; exit 2;;
esac
OUT="$1"
MODE="${2:-open}"  # (without a mode: the plan's first call, what the open issues still lack)
case "$MODE" in open|extra|main|product|final|learner) ;; *) echo "bench/gpu/lease.sh: mode must be open, extra, main, product, final or learner, got '$MODE'" >&2; exit 2;; esac
for knob in EXTRA_TOTAL_S CURVE_S; do  # extra mode's time settings (checked in every mode: a typo must not cost a lease)
  if [[ -n "${!knob:-}" ]] && ! [[ "${!knob}" =~ ^[1-9][0-9]*$ ]]; then
    echo "bench/gpu/lease.sh: $knob must be a whole number of seconds >= 1, got '${!knob}'" >&2; exit 2
  fi
done
PY="${PYTHON:-python3}"
CHECK="${LEASE_CHECK_ONLY:-}"
if ! "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)" 2>/dev/null; then
  # (found, not imported: ~1.5 s less per call; the first phase imports it)
  echo "bench/gpu/lease.sh: $PY has no torch; set PYTHON to the python that has the product's packages" >&2
  exit 2
fi
W="${TMPDIR:-/tmp}/gpu_lease_$MODE${CHECK:+_check}"  # (a check keeps the last lease's work folder)
rm -rf "$W" && mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [[ "$MODE" == learner || "$MODE" == open ]]; then  # its settings checked before the first phase: a mistake must not cost the lease
  LB="${LEARNER_BUDGET_S:-360}"  # rows not started after this many seconds (the phase ends 40 s later)
  if ! [[ "$LB" =~ ^[1-9][0-9]*$ ]]; then
    echo "bench/gpu/lease.sh: LEARNER_BUDGET_S must be a whole number of seconds >= 1, got '$LB'" >&2; exit 2
  fi
  # LEARNER_ARGS: more arguments, shell-quoted (e.g. --shapes qwen2.5-0.5b --learners "torch packed varlen"), split
  # as the shell would (Python's shlex: no command substitution), then checked by the benchmark's own parser
  if ! "$PY" -c 'import shlex, sys
try:
    sys.stdout.write("".join(a + "\0" for a in shlex.split(sys.argv[1])))
except ValueError as e:
    sys.exit(f"shlex: {e}")' "${LEARNER_ARGS:-}" > "$W/learner_args"; then
    echo "bench/gpu/lease.sh: LEARNER_ARGS is not shell-quoted right: ${LEARNER_ARGS:-}" >&2; exit 2
  fi
  if [[ "$MODE" == open ]] && ! [[ "${OPEN_TOTAL_S:-530}" =~ ^[1-9][0-9]*$ ]]; then
    echo "bench/gpu/lease.sh: OPEN_TOTAL_S must be a whole number of seconds >= 1, got '${OPEN_TOTAL_S}'" >&2; exit 2
  fi
  EXTRA=()
  [[ -s "$W/learner_args" ]] && mapfile -d '' -t EXTRA < "$W/learner_args"
  "$PY" bench/gpu/learner_args.py --out "$W/learner" "${EXTRA[@]}" || {
    echo "bench/gpu/lease.sh: LEARNER_ARGS refused by bench/gpu/learner_args.py (above)" >&2; exit 2; }
  if [[ -n "$CHECK" ]]; then  # the settings: the benchmark's arguments, one a line
    [[ "$MODE" == learner ]] && echo "learner budget: $LB s"
    if (( ${#EXTRA[@]} )); then printf 'learner argument: [%s]\n' "${EXTRA[@]}"; else echo "learner arguments: (none)"; fi
  fi
fi
if [[ -z "$CHECK" ]] && compgen -G ".whl/*.whl" > /dev/null; then
  # once per machine: a call on a machine an earlier call left warm (extra after open) finds them installed
  WHEELS="$(cd .whl && ls -1 ./*.whl | sort | tr '\n' ' ')"
  if [[ "$(cat /tmp/pacs_fast_site/.lease_wheels 2>/dev/null)" == "$WHEELS" ]]; then
    echo "== wheels of .whl/ already installed in /tmp/pacs_fast_site"
  else
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/pacs_fast_site \
      .whl/*.whl && printf '%s' "$WHEELS" > /tmp/pacs_fast_site/.lease_wheels
  fi
  export PYTHONPATH="$PYTHONPATH:/tmp/pacs_fast_site"
fi
T0=$(date +%s)
pack() {
  tar czf "$OUT/lease.tgz.tmp" -C "$W" --exclude='model_*' --exclude='runs' --exclude='*.safetensors' \
    --exclude='*.pt' . && mv "$OUT/lease.tgz.tmp" "$OUT/lease.tgz"
}
phase() {  # phase NAME LIMIT_S CMD...: runs CMD with its output in $W/NAME.log, prints the log's tail, packs
  local name=$1 lim=$2; shift 2
  if [[ -n "$CHECK" ]]; then echo "== $name: limit ${lim} s: $*"; return; fi  # LEASE_CHECK_ONLY: the plan only
  echo "== $name: limit ${lim} s, at $(( $(date +%s) - T0 )) s"
  # SIGINT first (pytest then writes its JUnit XML of the tests it finished; the benchmarks keep the rows they wrote),
  # SIGKILL 10 s later (a kernel hung on the GPU does not see the signal)
  timeout -s INT -k 10 "$lim" "$@" > "$W/$name.log" 2>&1
  echo "== $name: rc $? after $(( $(date +%s) - T0 )) s"
  grep -v "^\s*$" "$W/$name.log" | tail -n "${TAIL:-14}"
  pack
}
passed() {  # passed JUNIT_XML TEST_NAME: that test ran and passed (no failure, error or skip element)
  "$PY" - "$1" "$2" <<'EOF'
import sys
import xml.etree.ElementTree as ET
try:
    cases = list(ET.parse(sys.argv[1]).getroot().iter("testcase"))
except (OSError, ET.ParseError):
    sys.exit(1)
sys.exit(0 if any(c.get("name") == sys.argv[2] and not list(c) for c in cases) else 1)
EOF
}
gluon_methods() {  # gluon_methods JUNIT_XML: GLUON (bench methods), GLUON_K (tuner kernels) and PINGPONG (tuner
  # kernels whose ping-pong launch joins the sweep) of the Gluon kernels whose float64 check passed in this
  # call (a kernel that fails or hangs is left out)
  GLUON="" GLUON_K="" PINGPONG=""
  local fwd=0 dz=0
  passed "$1" test_gluon_forward_matches_float64_on_hopper && fwd=1
  passed "$1" test_gluon_dz_kernel_matches_float64_on_hopper && dz=1
  if (( fwd && dz )); then GLUON=",pacs_triton_gluon"; elif (( fwd )); then GLUON=",pacs_triton_gluon_fwd";
  elif (( dz )); then GLUON=",pacs_triton_gluon_dz"; fi
  (( fwd )) && GLUON_K="$GLUON_K,linear_logprobs.stats_gluon"
  (( dz )) && GLUON_K="$GLUON_K,linear_logprobs.dlogits_gluon"
  (( fwd )) && passed "$1" test_gluon_pingpong_forward_matches_float64_on_hopper && PINGPONG="linear_logprobs.stats_gluon"
  (( dz )) && passed "$1" test_gluon_pingpong_dz_kernel_matches_float64_on_hopper && \
    PINGPONG="$PINGPONG,linear_logprobs.dlogits_gluon"
  # both ping-pong launches checked: they are also benchmarked as a method of their own
  [[ "$PINGPONG" == linear_logprobs.stats_gluon,linear_logprobs.dlogits_gluon ]] && GLUON="$GLUON,pacs_triton_gluon_pp"
  echo "== Gluon kernels that passed their float64 check here: forward $fwd, dz $dz; ping-pong: ${PINGPONG:-none}"
}
if [[ "$MODE" == open ]]; then  # ~9 minutes (the header's plan)
  phase pacs_tests 90 "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_fused_pacs_loss.py \
    tests/test_pacs_loss.py tests/test_cuda_graph.py --junitxml="$W/pacs_tests.xml"
  phase learner_kernels_test 90 "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider \
    tests/test_kernel_fallback_training.py --junitxml="$W/learner_kernels_test.xml"
  phase pacs_loss 75 "$PY" bench/bench_pacs_loss.py --device cuda --repeat 10 --loop-max-b 0 --group-size 8,64 \
    --out "$W/pacs_loss.json"
  phase host 45 "$PY" bench/gpu/pacs_loss_host_profile.py --out "$W/host"
  phase logprobs 75 "$PY" bench/gpu/logprobs.py --shapes 8192x4096x151936 \
    --methods pacs_triton,pacs_triton_upcast,liger_flce,cce --iters 5 --out "$W/logprobs_main.json"
  phase logprobs_fp32 40 "$PY" bench/gpu/logprobs.py --shapes 8192x4096x151936 --dtype fp32 \
    --methods pacs_triton,liger_flce --iters 3 --out "$W/logprobs_fp32.json"
  phase shapes 90 "$PY" bench/gpu/logprobs.py --shapes 8192x896x151936,8192x3584x151936,8192x4096x32000 \
    --methods pacs_triton,pacs_triton_tma,liger_flce,cce --iters 3 --profile --out "$W/logprobs_shapes.json"
  phase attention 120 "$PY" bench/gpu/attention.py --out "$W/attention"  # (flex's first call compiles)
  LEFT=$(( ${OPEN_TOTAL_S:-530} - ($(date +%s) - T0) - 40 ))  # the learner rows get what is left (>= 60 s)
  (( LEFT < 60 )) && LEFT=60
  phase learner $(( LEFT + 40 )) "$PY" bench/gpu/learner.py --out "$W/learner" --budget-s "$LEFT" \
    --shapes qwen2.5-0.5b --learners "torch packed varlen,torch padded + SDPA,megatron packed THD,megatron padded" \
    "${EXTRA[@]}"
elif [[ "$MODE" == extra ]]; then  # ~3.5 minutes on the machine open left warm (the header's plan)
  # the curve's budgets (CURVE_BUDGETS): up to the whole 32k batch, 66,048 tokens, on an H200 (139 GiB); on an H100
  # (79 GiB) up to 52,224 (the memory model predicts 71 GiB at 66,048: an out-of-memory row would leave two points)
  if [[ -z "${CURVE_BUDGETS:-}" ]]; then
    GIB="${CURVE_GPU_GIB:-$("$PY" -c 'import torch
print(torch.cuda.get_device_properties(0).total_memory >> 30 if torch.cuda.is_available() else 0)' 2>/dev/null)}"
    CURVE_BUDGETS=17408,34816,66048
    [[ "$GIB" =~ ^[0-9]+$ ]] && (( GIB > 0 && GIB < 100 )) && CURVE_BUDGETS=17408,34816,52224
  fi
  CURVE=(--shapes qwen2.5-1.5b --lengths 32k --learners "torch packed varlen + Liger layers" --recompute selective
         --token-budgets "$CURVE_BUDGETS")
  "$PY" bench/gpu/learner_args.py --out "$W/curve" "${CURVE[@]}" > /dev/null || exit 2
  phase curve $(( ${CURVE_S:-110} + 30 )) "$PY" bench/gpu/learner.py --out "$W/curve" --budget-s "${CURVE_S:-110}" \
    "${CURVE[@]}"
  LEFT=$(( ${EXTRA_TOTAL_S:-200} - ($(date +%s) - T0) - 5 ))  # the grid gets what is left (>= 30 s)
  (( LEFT < 30 )) && LEFT=30
  phase grid "$LEFT" "$PY" bench/gpu/logprobs.py --methods pacs_triton --iters 3 --out "$W/logprobs_grid.json" \
    --shapes 8192x8192x128256,8192x4096x128256,2048x4096x151936,32768x4096x151936,65536x4096x151936
elif [[ "$MODE" == main ]]; then
  if [[ -z "${MAIN_SKIP_SUITE:-}" ]]; then
    phase suite 230 "$PY" bench/gpu/suite.py "$W/suite" --steps env,gpu_tests,logprobs,pacs_loss --budget-s 220
    gluon_methods "$W/suite/gpu_tests.xml"
  else  # (after open: the Gluon kernels' float64 check alone, for the tuner's list)
    phase gluon_check 120 "$PY" -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_linear_logprobs_gluon.py \
      --junitxml="$W/gluon_check.xml"
    gluon_methods "$W/gluon_check.xml"
  fi
  K=linear_logprobs.stats_tiles,linear_logprobs.stats_tma,linear_logprobs.dlogits,linear_logprobs.dlogits_tma$GLUON_K
  # the log-prob kernels only: the PACS loss's table was measured on 2026-11-26 (0.68-0.74 of the copy);
  # the tuner merges into the table it finds in --out-dir, so it starts from this checkout's (on
  # 2026-11-27 it started from an empty folder and the table it wrote had lost the PACS loss's entries)
  mkdir -p "$W/tuned" && cp kernels/tuned/sm_*.json "$W/tuned/" 2>/dev/null
  phase tune 175 "$PY" bench/gpu/tune.py --kernels "$K" --pingpong "$PINGPONG" --also-h 896 --budget-s 140 \
    --out-dir "$W/tuned"
  if [[ -z "$CHECK" ]] && compgen -G "$W/tuned/sm_*.json" > /dev/null; then
    mkdir -p kernels/tuned && cp "$W"/tuned/sm_*.json kernels/tuned/
  fi
  phase tuned_logprobs 90 "$PY" bench/gpu/logprobs.py --shapes 8192x4096x151936 \
    --methods "pacs_triton,pacs_triton_tma$GLUON,liger_flce,cce" \
    --iters 5 --profile --out "$W/logprobs_tuned.json"
  phase shapes 90 "$PY" bench/gpu/logprobs.py --shapes 8192x896x151936,8192x3584x151936,8192x4096x32000 \
    --methods "pacs_triton,pacs_triton_tma$GLUON,liger_flce,cce" --iters 3 --profile --out "$W/logprobs_shapes.json"
  if [[ -n "${MAIN_SKIP_SUITE:-}" ]]; then  # (after open) the rest of issue 39's grid: H=8192 and V=128,256, N 2k-64k
    phase grid 100 "$PY" bench/gpu/logprobs.py --methods pacs_triton --iters 3 --out "$W/logprobs_grid.json" \
      --shapes 8192x8192x128256,8192x4096x128256,2048x4096x151936,32768x4096x151936,65536x4096x151936
  fi
elif [[ "$MODE" == final ]]; then  # ~6 minutes (~8 with .old/)
  phase gluon_check 200 "$PY" -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_linear_logprobs_gluon.py \
    --junitxml="$W/gluon_check.xml"
  gluon_methods "$W/gluon_check.xml"
  phase pacs_loss_final 40 "$PY" bench/bench_pacs_loss.py --device cuda --repeat 10 --loop-max-b 0 \
    --out "$W/pacs_loss_final.json"
  if [[ -d .old/pacs_fast ]]; then  # the same benchmark on an earlier tree (git archive into .old/): A/B in one call
    phase pacs_loss_old 35 env PYTHONPATH=".old:$PYTHONPATH" "$PY" .old/bench/bench_pacs_loss.py \
      --device cuda --repeat 10 --loop-max-b 0 --out "$W/pacs_loss_old.json"
  fi
  phase logprobs_final 75 "$PY" bench/gpu/logprobs.py --shapes 8192x4096x151936 \
    --methods "pacs_triton,pacs_triton_tma$GLUON,liger_flce" \
    --iters 5 --profile --out "$W/logprobs_final.json"
  if [[ -d .old/pacs_fast ]]; then  # A/B of the default log-prob path: the earlier tree, then this one
    AB=(--shapes 8192x896x151936,8192x4096x151936 --methods pacs_triton --iters 5)
    OLD_LP=.old/bench/gpu/logprobs.py
    [[ -f "$OLD_LP" ]] || OLD_LP=.old/bench/gpu_logprobs.py  # a tree from before bench/gpu/ existed
    phase logprobs_ab_old 60 env PYTHONPATH=".old:$PYTHONPATH" "$PY" "$OLD_LP" "${AB[@]}" \
      --out "$W/logprobs_ab_old.json"
    phase logprobs_ab_new 60 "$PY" bench/gpu/logprobs.py "${AB[@]}" --out "$W/logprobs_ab_new.json"
  fi
  phase gpu_tests_final 50 "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider tests
  phase megatron 75 "$PY" bench/gpu/suite.py "$W/suite" --steps megatron_run --budget-s 70
elif [[ "$MODE" == learner ]]; then
  phase learner_tests 120 "$PY" -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_varlen_attention.py \
    tests/test_fused_layers.py --junitxml="$W/learner_tests.xml"
  phase learner $(( LB + 40 )) "$PY" bench/gpu/learner.py --out "$W/learner" --budget-s "$LB" "${EXTRA[@]}"
else
  phase product 330 "$PY" bench/gpu/suite.py "$W/suite" --steps env,compile,megatron_run,trl_run --budget-s 320
fi
# every mode: issues 38's and 39's targets read off what this call measured (met / not met, with the files)
TAIL=0 phase targets 30 "$PY" bench/gpu/targets.py "$W" --json "$W/targets.json"
if [[ -z "$CHECK" && -f "$W/targets.log" ]]; then grep '^| [0-9]' "$W/targets.log" | grep -v '| not measured |'; fi
echo "== done after $(( $(date +%s) - T0 )) s"
