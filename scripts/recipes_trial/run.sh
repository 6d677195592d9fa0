#!/usr/bin/env bash
# The recipe keys of issue 40 (dynamic sampling, overlong shaping and filtering, GSPO / CISPO, trackers, the
# separate-pass correction) on a Qwen2.5-0.5B-width model (151,936 vocabulary rows, hidden 896, 14 / 2 heads,
# 2 layers; a byte-level BPE tokenizer with a chat template; random weights) and a GSM8K slice, in every
# layout: one process (HF engine, vLLM), asynchronous (torchrun, an engine process), megatron TP=2; then bad
# values, each one line before any model loads. ~10 min on 2 CPU cores.
#   bash scripts/recipes_trial/run.sh /tmp/trial    # then: python scripts/recipes_trial/summary.py /tmp/trial
set -u
cd "$(dirname "$0")/../.."; . .venv/bin/activate
T=${1:-/tmp/recipes_trial}; M=$T/qwen; D=$T/data.jsonl; O=$T/runs
[ -f $M/config.json ] || python scripts/recipes_trial/make_model.py $T
export OMP_NUM_THREADS=2 WANDB_MODE=offline PYTHONWARNINGS=ignore
rm -rf $O; mkdir -p $O
C="model.path=$M data.dataset=$D data.eval_dataset=$D data.eval_size=8 rollout.n=4 rollout.max_new_tokens=16
 rollout.eval_n=2 train.prompts_per_step=4 learner.mini_batch_prompts=4 learner.micro_batch_prompts=2 train.steps=2
 train.eval_every=2 train.save_every=1 train.out_dir=$O reward.noise_fp=0.4 train.progress=false"
run() { name=$1; shift; echo "=== $name: $*"; s=$(date +%s); "$@" > $T/$name.log 2>&1; rc=$?; echo "rc=$rc $(( $(date +%s)-s )) s"; tail -n 4 $T/$name.log | cut -c1-300; }
py="python -m pacs_fast.train"
tr2="torchrun --nproc_per_node 2 -m pacs_fast.train"
run A_pacs_ds_overlong_trackers $py $C train.run_name=A rollout.filter_groups=true rollout.max_gen_batches=3 \
    reward.overlong_buffer_len=4 learner.mask_truncated=true "train.loggers=[tensorboard,wandb,mlflow,trackio]"
run B_gspo $py $C train.run_name=B algo.name=gspo
run C_cispo_ds $py $C train.run_name=C algo.name=cispo rollout.filter_groups=true
run D_async_cispo_ds_overlong $tr2 $C train.run_name=D algo.name=cispo rollout.ranks=1 rollout.max_staleness=1 \
    rollout.filter_groups=true reward.overlong_buffer_len=4
run E_async_pacs_separate $tr2 $C train.run_name=E rollout.ranks=1 rollout.max_staleness=1 correction.fused=false \
    learner.mask_truncated=true
run F_megatron_tp2_gspo $tr2 $C train.run_name=F learner.backend=megatron learner.tp_size=2 algo.name=gspo \
    rollout.filter_groups=true reward.overlong_buffer_len=4 learner.mask_truncated=true
run G_vllm_pacs_ds $py $C train.run_name=G rollout.engine=vllm rollout.filter_groups=true reward.overlong_buffer_len=4 \
    rollout.gpu_memory_utilization=0.1
i=0
for bad in "rollout.max_gen_batches=0 rollout.filter_groups=true" "reward.overlong_buffer_len=17" \
           "reward.overlong_penalty=-1 reward.overlong_buffer_len=4" "algo.name=gspo algo.clip_low=-1" \
           "train.loggers=[tensorboard,foo]" "correction.fused=maybe" "learner.mask_truncated=maybe"; do
  i=$((i+1)); echo "=== bad: $bad"
  timeout 120 $py $C train.run_name=bad$i $bad 2>&1 | tail -n 1 | cut -c1-300; echo "rc=${PIPESTATUS[0]} (2 expected)"
done
