#!/usr/bin/env bash
# The gpu-marked tests and the GPU benchmarks, on a GPU machine whose python3 already holds torch
# with CUDA (a cluster's or a cloud's image): no network, no apt, no venv of our own. distenv is put
# on that Python's path where it is not importable (a .pth file naming this checkout), .venv links
# to that Python's environment (the tests start ranks with .venv/bin/python), and python-hostlist,
# distenv's one other dependency, comes from $WHEELS when that Python lacks it.
#
#     WHEELS=<folder of wheels> bash tests/run_gpu.sh [OUT]
#
# ROUNDS (default 8) sets each bootstrap benchmark's paired rounds; TESTS (default: every file with
# gpu-marked tests) the tests to run; BENCHMARKS (default "nccl cpu placement") the benchmarks;
# either set empty runs none.
#
# OUT (default $OUT, else /tmp/distenv-gpu) receives the machine's facts (machine.txt), the
# tests' log (pytest.log) and the benchmarks' JSON (and each step's log): bootstrap_nccl.json (one rank per GPU, NCCL with
# device_id=, bare env:// against distenv), bootstrap_cpu.json (gloo, 8 ranks on the machine's
# cores, its GPUs hidden) and placement.json. Every step runs under its own time limit; the script
# exits with the first failing step's status after running them all.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit
out=${1:-${OUT:-/tmp/distenv-gpu}}
mkdir -p "$out"
py=$(command -v python3)
rounds=${ROUNDS:-8}
# A launch on such a machine takes about 9 s (every rank imports a CUDA torch): 2 per round.
bench_s=$((20 * (rounds + 1) + 20))
read -ra tests <<<"${TESTS-tests/process/test_gpu.py tests/integration/test_placement.py tests/integration/test_recipes.py}"
read -ra benchmarks <<<"${BENCHMARKS-nccl cpu placement}"
status=0

step() { # seconds name log command...: run it under its limit, its output kept in log too
    local limit=$1 name=$2 log=$3
    shift 3
    echo "== $name ($(date +%T))"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc"
    ((rc == 0 || status != 0)) || status=$rc
}

{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    nvidia-smi topo -m
    echo "nproc $(nproc); NUMA nodes: $(find /sys/devices/system/node -maxdepth 1 -name "node[0-9]*" | wc -l)"
    "$py" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "nccl", ".".join(map(str, torch.cuda.nccl.version())),
"gpus", torch.cuda.device_count())'
} >"$out/machine.txt" 2>&1
cat "$out/machine.txt"

# From another folder: here the checkout itself is on `python -c`'s path, not on that of the ranks,
# the benchmarks and the scripts the tests start.
if ! (cd / && "$py" -c 'import distenv' 2>/dev/null); then
    site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$PWD" >"$site/distenv-checkout.pth"
fi
"$py" -c 'import hostlist' 2>/dev/null ||
    "$py" -m pip install -q --no-index --no-deps --no-compile "${WHEELS:?python-hostlist is missing: set WHEELS}"/*.whl
# Compiled once here (as tests/harness/setup.sh does), so that no rank compiles the checkout's
# modules at each start where PYTHONDONTWRITEBYTECODE is set: a read-only checkout only costs time.
env -u PYTHONDONTWRITEBYTECODE "$py" -m compileall -q -j 0 distenv benchmarks tests >/dev/null ||
    echo "note: the checkout's modules could not be compiled; every rank compiles them"
[[ -e .venv ]] || ln -s "$(dirname "$(dirname "$py")")" .venv
[[ -x .venv/bin/python ]] || ln -s "$py" .venv/bin/python

# DeepSpeed's GPU recipe needs deepspeed (not in a torch image; it builds on install): left out.
((${#tests[@]} == 0)) ||
    step 240 "pytest -m gpu" "$out/pytest.log" "$py" -m pytest -m gpu -p no:cacheprovider -q -rA \
    -k "not deepspeed" "${tests[@]}"
gpus=$("$py" -c 'import torch; print(torch.cuda.device_count())')
[[ " ${benchmarks[*]} " != *" nccl "* ]] ||
    step "$bench_s" "bootstrap, NCCL" "$out/bootstrap_nccl.log" "$py" benchmarks/bench_bootstrap.py \
    --backend nccl --launchers torchrun --nprocs "$gpus" --rounds "$rounds" --mmengine-rounds 0 \
    --out "$out/bootstrap_nccl.json"
[[ " ${benchmarks[*]} " != *" cpu "* ]] ||
    step "$bench_s" "bootstrap, 8 ranks on CPU" "$out/bootstrap_cpu.log" env CUDA_VISIBLE_DEVICES= \
    "$py" benchmarks/bench_bootstrap.py --launchers torchrun --nprocs 8 --rounds "$rounds" \
    --mmengine-rounds 0 \
    --out "$out/bootstrap_cpu.json"
[[ " ${benchmarks[*]} " != *" placement "* ]] ||
    step 30 "placement" "$out/placement.log" "$py" benchmarks/bench_placement.py \
    --out "$out/placement.json"
exit "$status"
