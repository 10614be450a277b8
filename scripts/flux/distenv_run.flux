#!/bin/bash
# Flux (flux batch): one task per node runs `distenv run`, which starts that node's ranks, one per
# GPU; distenv takes the node count and index from Flux and the master from this script.
#
#   flux batch --env=TRAIN=train.py scripts/flux/distenv_run.flux     # 2 nodes x 4 GPUs
#   flux batch -N 4 --env=TRAIN=my_train.py --env=GPUS_PER_NODE=8 scripts/flux/distenv_run.flux
#
# Options given to flux batch on the command line override the #flux: lines below. Arguments
# after the script name are passed on to the training script. Flux gives several tasks on each of
# several nodes no node index or local size, so the tasks are one distenv run per node. Not run
# under a real Flux (none could be installed in distenv's test environment): its tests run it with
# a stand-in flux and its rank command, for real, with Flux's recorded task environment.
#
#flux: -N 2
#flux: -t 60m
#flux: --job-name=train-flux
#flux: --output=train-flux.{{id}}.out

set -euo pipefail

TRAIN=${TRAIN:?set TRAIN to your training script, e.g. flux batch --env=TRAIN=train.py ...}
LAUNCHER=${LAUNCHER:-pytorch}
GPUS_PER_NODE=${GPUS_PER_NODE:-4}

# This batch job is a Flux instance with one broker per node: its size is the node count. With
# the default "block" task map, task 0 (node 0, whose ranks include rank 0) runs on its first host.
NODES=${NODES:-$(flux getattr size)}
MASTER_ADDR=${MASTER_ADDR:-$(flux hostlist --nth=0 instance)}

# One task per node with the node's GPUs; distenv run starts GPUS_PER_NODE ranks in each.
flux run -N "$NODES" --tasks-per-node=1 --gpus-per-task="$GPUS_PER_NODE" \
    distenv run --nproc-per-node "$GPUS_PER_NODE" --master-addr "$MASTER_ADDR" \
    "$TRAIN" --launcher "$LAUNCHER" "$@"
