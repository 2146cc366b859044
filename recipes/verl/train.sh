#!/usr/bin/env bash
# GRPO, GiGPO or DeltaTTG on verl 0.9.1 with deltattg's plugin, the paper's Table 4 settings (docs/verl.md).
#
#   METHOD=deltattg SETTING=alfworld NNODES=1 recipes/verl/train.sh [hydra overrides...]
#
# METHOD   grpo_step | gigpo | deltattg (or any name `deltattg methods` marks as running on verl)
# SETTING  alfworld (batch 16, G 8, 50 turns, 1024 tokens/turn, KL 0.01, entropy 0.001, clip 0.2, C 16384)
#          papersearch (PaperSearchQA-style: batch 512, G 16, 20 turns, 2048 tokens/turn, KL 0.001, entropy 0,
#          clip-high 0.28, C 6144; we have no PaperSearchQA environment: TASKS defaults to BFCL multi-turn)
# NNODES   1 or 2 nodes of GPUS_PER_NODE (8) GPUs; DeltaTTG keeps GPU 7 of node 0 for the meter (serve_meter.sh),
#          so the actor gets 7 GPUs per node.
# MODEL    the actor (default Qwen/Qwen3-4B, the paper's); METER: the meter endpoint (default http://HEAD:8100/v1)
#          or a saved regression meter folder; METER_MODEL: the served meter's name.
# DRY_RUN=1 prints the commands instead of running them.
set -euo pipefail
METHOD=${METHOD:-deltattg}
SETTING=${SETTING:-alfworld}
NNODES=${NNODES:-1}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MODEL=${MODEL:-Qwen/Qwen3-4B}
METER=${METER:-http://$(hostname -I 2>/dev/null | awk '{print $1}'):8100/v1}
METER_MODEL=${METER_MODEL:-deltattg-meter}
OUT=${OUT:-runs/verl-$METHOD-$SETTING}
here=$(cd "$(dirname "$0")" && pwd)
run() { if [[ -n ${DRY_RUN:-} ]]; then printf '%q ' "$@"; echo; else "$@"; fi; }  # DRY_RUN=1: print the commands

case $SETTING in
  alfworld)    BATCH=16;  GROUP=8;  TURNS=50; TOKENS=1024; KL=0.01;  ENT=0.001; CLIP_HIGH=0.2;  C=16384
               ENV_ARGS=(--env alfworld); VAL_SPLIT=valid_seen ;;
  papersearch) BATCH=512; GROUP=16; TURNS=20; TOKENS=2048; KL=0.001; ENT=0;     CLIP_HIGH=0.28; C=6144
               ENV_ARGS=(--env bfcl);     VAL_SPLIT=base ;;
  *) echo "SETTING must be alfworld or papersearch" >&2; exit 2 ;;
esac

ACTOR_GPUS=$GPUS_PER_NODE
METER_ARGS=()
if [[ $METHOD == deltattg* ]]; then
  ACTOR_GPUS=$((GPUS_PER_NODE - 1))   # GPU 7 serves the meter
  METER_ARGS=(+algorithm.deltattg.meter="$METER" +algorithm.deltattg.meter_model="$METER_MODEL"
              +algorithm.deltattg.failure_cost=$C +algorithm.deltattg.rho=0.2 +algorithm.deltattg.cap=5.0)
fi

run mkdir -p "$OUT"
[[ -f $OUT/train.parquet ]] || run deltattg verl-tasks "${ENV_ARGS[@]}" --out "$OUT/train.parquet"
[[ -f $OUT/val.parquet ]] || run deltattg verl-tasks "${ENV_ARGS[@]}" --split "$VAL_SPLIT" --limit 128 --out "$OUT/val.parquet"

run python -m verl.trainer.main_ppo \
  trainer.v1.trainer_mode=deltattg \
  algorithm.adv_estimator="$METHOD" \
  algorithm.use_kl_in_reward=false \
  data.train_files="$OUT/train.parquet" data.val_files="$OUT/val.parquet" \
  data.train_batch_size=$BATCH data.max_prompt_length=4096 data.max_response_length=$TOKENS \
  data.return_raw_chat=true data.filter_overlong_prompts=false \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.actor.optim.lr=1e-6 \
  actor_rollout_ref.actor.ppo_mini_batch_size=$BATCH \
  actor_rollout_ref.actor.use_dynamic_bsz=true \
  actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=$KL \
  actor_rollout_ref.actor.entropy_coeff=$ENT \
  actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=$CLIP_HIGH \
  actor_rollout_ref.actor.clip_ratio_c=3.0 actor_rollout_ref.actor.loss_agg_mode=token-mean \
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=$GROUP \
  actor_rollout_ref.rollout.temperature=1.0 actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=$TURNS \
  actor_rollout_ref.rollout.agent.default_agent_loop=deltattg_env \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$here/agent_loop.yaml" \
  trainer.nnodes=$NNODES trainer.n_gpus_per_node=$ACTOR_GPUS \
  trainer.default_local_dir="$OUT/checkpoints" trainer.project_name=deltattg \
  trainer.experiment_name="$METHOD-$SETTING" trainer.logger='[console]' \
  "${METER_ARGS[@]}" "$@"
