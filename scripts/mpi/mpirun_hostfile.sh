#!/bin/bash
# mpirun over the hosts of a hostfile. distenv reads the MPI library's own variables
# (OMPI_COMM_WORLD_RANK, ... or PMI_RANK, ...); no MASTER_ADDR is needed: inside a Slurm or LSF
# allocation the master is the allocation's first host, elsewhere distenv asks rank 0 over MPI
# (pip install 'distenv[mpi]' for mpi4py).
#
#   TRAIN=train.py HOSTFILE=hosts.txt scripts/mpi/mpirun_hostfile.sh [train args...]  # NP = sum of slots
#   sbatch -N 2 --ntasks-per-node 4 --export=ALL,TRAIN=train.py scripts/mpi/mpirun_hostfile.sh
#
# hosts.txt, Open MPI syntax (MPICH's mpiexec -f wants "node01:4" instead):
#   node01 slots=4
#   node02 slots=4
#
# Ranks are placed slot by slot: node01 gets ranks 0-3, node02 ranks 4-7. distenv assumes every
# node holds the same number of ranks (it derives node_rank from the local size).
set -euo pipefail

TRAIN=${TRAIN:?set TRAIN to your training script, e.g. TRAIN=train.py HOSTFILE=hosts.txt ...}
LAUNCHER=${LAUNCHER:-mpi}
MPIRUN=${MPIRUN:-mpirun}

if [[ -z ${HOSTFILE:-} ]]; then
    if [[ -z ${SLURM_JOB_NODELIST:-} ]]; then
        echo "mpirun_hostfile.sh: set HOSTFILE (one 'host slots=N' line per node)" >&2
        exit 2
    fi
    # Inside a Slurm batch script: write the allocation as a hostfile, ONCE, here (never per rank).
    HOSTFILE=$(mktemp "${TMPDIR:-/tmp}/hostfile.XXXXXX")
    trap 'rm -f "$HOSTFILE"' EXIT
    scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\$/ slots=${SLURM_NTASKS_PER_NODE:-1}/" >"$HOSTFILE"
fi

# Default: one rank per slot.
NP=${NP:-$(awk '{ for (i = 2; i <= NF; i++) if (sub(/^slots=/, "", $i)) n += $i } END { print n + 0 }' "$HOSTFILE")}

# Open MPI as root or on a laptop may also need --allow-run-as-root / --oversubscribe; set them in
# MPIRUN_ARGS rather than editing this line.
# shellcheck disable=SC2086  # MPIRUN_ARGS is a list of options on purpose
"$MPIRUN" ${MPIRUN_ARGS:-} --hostfile "$HOSTFILE" -np "$NP" python "$TRAIN" --launcher "$LAUNCHER" "$@"
