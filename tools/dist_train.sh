#!/usr/bin/env bash
# Train on GPUS processes of this machine (or NNODES machines) with torchrun.
# Usage: bash tools/dist_train.sh CONFIG GPUS [train.py options]
# The project's .venv where it exists (make test/demo create it), else
# the python on PATH; $PYTHON overrides both.
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
    PYTHON=python
    if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; fi
fi
CONFIG=$1
GPUS=$2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-"127.0.0.1"}

PYTHONPATH="$(dirname "$0")/..":$PYTHONPATH \
exec "$PYTHON" -m torch.distributed.run \
    --nnodes=$NNODES --node_rank=$NODE_RANK --master_addr=$MASTER_ADDR \
    --nproc_per_node=$GPUS --master_port=$PORT \
    "$(dirname "$0")/train.py" "$CONFIG" --launcher pytorch "${@:3}"
