#!/usr/bin/env bash
# Serve the generative progress meter (a `deltattg train-meter --kind generative` folder or HF id) with vLLM on one
# GPU, prefix caching on: the decision states of a trajectory are prefixes of one another, so each reading re-reads
# only the newest turn. train.sh reaches it through algorithm.deltattg.meter=http://HOST:PORT/v1.
#
#   METER_PATH=runs/gen GPU=7 PORT=8100 recipes/verl/serve_meter.sh
set -euo pipefail
METER_PATH=${METER_PATH:?set METER_PATH to the trained meter}
CUDA_VISIBLE_DEVICES=${GPU:-7} exec python -m vllm.entrypoints.openai.api_server \
  --model "$METER_PATH" --served-model-name "${METER_MODEL:-deltattg-meter}" \
  --host 0.0.0.0 --port "${PORT:-8100}" --enable-prefix-caching \
  --max-model-len "${MAX_LEN:-32768}" --gpu-memory-utilization 0.85 --dtype bfloat16
