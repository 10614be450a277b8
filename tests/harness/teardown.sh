#!/usr/bin/env bash
# Stop what tests/harness/setup.sh started: both test Slurm clusters (their jobs, slurmd and
# slurmctld daemons) and munged. Removes nothing: the venv, configs, state and logs under
# $DISTENV_TEST_STATE stay, so setup.sh starts again quickly. Idempotent.
set -euo pipefail

T0=$SECONDS
STATE=${DISTENV_TEST_STATE:-/var/tmp/distenv-test}

log() { printf '[teardown %3ds] %s\n' "$((SECONDS - T0))" "$*"; }

# Daemons of one cluster: those named in its pid files, plus any process whose command line ends in
# "-f <its slurm.conf>" (exactly how setup.sh starts them), in case a pid file is missing or stale.
cluster_pids() { # dir
    local dir=$1 f pid
    {
        for f in "$dir"/run/*.pid; do
            [[ -f "$f" ]] || continue
            pid=$(cat "$f")
            # Only if that pid still runs a Slurm daemon of this config.
            if [[ $pid =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-f $dir/slurm.conf"; then
                echo "$pid"
            fi
        done
        pgrep -f -- "^slurm(ctl)?d .*-f $dir/slurm\\.conf\$" || true
    } | sort -u
}

# Send TERM to the pids, wait up to $2 seconds, then KILL what is left.
stop_pids() { # "pids" timeout label
    local pids=$1 timeout=$2 label=$3 deadline left
    [[ -n $pids ]] || return 0
    # shellcheck disable=SC2086  # the pid list is meant to split
    kill $pids 2>/dev/null || true
    deadline=$((SECONDS + timeout))
    while :; do
        left=""
        for p in $pids; do
            if kill -0 "$p" 2>/dev/null; then left="$left $p"; fi
        done
        [[ -n $left ]] || break
        if ((SECONDS >= deadline)); then
            log "$label: still running after ${timeout}s, killing:$left"
            # shellcheck disable=SC2086
            kill -KILL $left 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
    log "$label: stopped"
}

for cluster in one multi; do
    dir=$STATE/$cluster
    conf=$dir/slurm.conf
    pids=$(cluster_pids "$dir")
    if [[ -z $pids ]]; then
        log "$cluster: not running"
        continue
    fi
    # Cancel its jobs first so no slurmstepd outlives the daemons (bounded; ignore failures).
    SLURM_CONF=$conf timeout 10 scancel --user=root 2>/dev/null || true
    stop_pids "$(tr '\n' ' ' <<<"$pids")" 15 "$cluster"
done

munge_pid=""
if [[ -f /run/munge/munged.pid ]]; then
    munge_pid=$(cat /run/munge/munged.pid)
    [[ "$(cat "/proc/$munge_pid/comm" 2>/dev/null || true)" == munged ]] || munge_pid=""
fi
if [[ -z $munge_pid ]]; then
    munge_pid=$(pgrep -x munged || true)
fi
if [[ -n $munge_pid ]]; then
    stop_pids "$munge_pid" 10 munged
else
    log "munged: not running"
fi
log "done in $((SECONDS - T0)) s"
