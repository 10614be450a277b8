#!/bin/bash
# mpirun over the hosts of a hostfile, with Open MPI or MPICH (Hydra). distenv reads the MPI
# library's own variables (OMPI_COMM_WORLD_RANK, ... or PMI_RANK, ...); no MASTER_ADDR is needed:
# inside a Slurm or LSF allocation the master is the allocation's first host, elsewhere distenv
# asks rank 0 over MPI (pip install 'distenv[mpi]' for mpi4py).
#
#   TRAIN=train.py HOSTFILE=hosts.txt scripts/mpi/mpirun_hostfile.sh [train args...]  # NP = sum of slots
#   TRAIN=train.py HOSTFILE=hosts.txt MPIRUN=mpiexec.hydra scripts/mpi/mpirun_hostfile.sh  # MPICH
#   sbatch -N 2 --ntasks-per-node 4 --export=ALL,TRAIN=train.py scripts/mpi/mpirun_hostfile.sh
#
# hosts.txt, one node per line, in either syntax (a bare host name is one slot):
#   node01 slots=4          (Open MPI)
#   node02:4                (MPICH's mpiexec -f)
# The script finds which MPI $MPIRUN is and hands it a hostfile in its own syntax.
#
# Ranks are placed slot by slot: node01 gets ranks 0-3, node02 ranks 4-7. distenv assumes every
# node holds the same number of ranks (it derives node_rank from the local size).
set -euo pipefail

TRAIN=${TRAIN:?set TRAIN to your training script, e.g. TRAIN=train.py HOSTFILE=hosts.txt ...}
LAUNCHER=${LAUNCHER:-mpi}
MPIRUN=${MPIRUN:-mpirun}

# "host slots" pairs, one per line, from the allocation or from HOSTFILE.
if [[ -z ${HOSTFILE:-} ]]; then
    if [[ -z ${SLURM_JOB_NODELIST:-} ]]; then
        echo "mpirun_hostfile.sh: set HOSTFILE (one 'host slots=N' or 'host:N' line per node)" >&2
        exit 2
    fi
    # Inside a Slurm batch script: the allocation's hosts, read ONCE, here (never per rank).
    PAIRS=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\$/ ${SLURM_NTASKS_PER_NODE:-1}/")
else
    PAIRS=$(awk '{ sub(/#.*/, "") }
        NF { host = $1; n = 1
             if (split(host, part, ":") == 2) { host = part[1]; n = part[2] }
             for (i = 2; i <= NF; i++) if ($i ~ /^slots=/) n = substr($i, 7)
             print host, n }' "$HOSTFILE")
fi

# Open MPI's mpirun reads "host slots=N" (--hostfile); MPICH's Hydra reads "host:N" (-f) and
# refuses the other ("token slots not supported"). Hydra names itself in --version.
HOSTS=$(mktemp "${TMPDIR:-/tmp}/hostfile.XXXXXX")
trap 'rm -f "$HOSTS"' EXIT
# (Read whole first: `| grep -q` under pipefail fails whenever $MPIRUN is killed by SIGPIPE.)
VERSION=$("$MPIRUN" --version 2>&1 || true)
if [[ ${VERSION,,} == *hydra* ]]; then
    awk '{ print $1 ":" $2 }' <<<"$PAIRS" >"$HOSTS"
    HOSTFILE_OPTION=-f
else
    awk '{ print $1 " slots=" $2 }' <<<"$PAIRS" >"$HOSTS"
    HOSTFILE_OPTION=--hostfile
fi

# Default: one rank per slot.
NP=${NP:-$(awk '{ n += $2 } END { print n + 0 }' <<<"$PAIRS")}

# Each rank keeps its output, and why it failed, in DISTENV_LOG_DIR (a folder every node sees);
# when the step fails, `distenv why` prints which rank failed first, how and where (docs: failures).
export DISTENV_LOG_DIR=${DISTENV_LOG_DIR:-$PWD/distenv-logs/${SLURM_JOB_ID:-$(date +%Y%m%d-%H%M%S)-$$}}
status=0

# Open MPI as root or on a laptop may also need --allow-run-as-root / --oversubscribe; set them in
# MPIRUN_ARGS rather than editing this line.
# shellcheck disable=SC2086  # MPIRUN_ARGS is a list of options on purpose
"$MPIRUN" ${MPIRUN_ARGS:-} "$HOSTFILE_OPTION" "$HOSTS" -n "$NP" python "$TRAIN" --launcher "$LAUNCHER" "$@" || status=$?
if ((status != 0)); then
    python -m distenv why "$DISTENV_LOG_DIR" >&2 || true
fi
exit "$status"
