"""Preemption: restart counts, the requeue command, the warning-signal watch and its agreement.

The multi-rank runs under the real `distenv run` are in
tests/process/test_preempt_processes.py; the Slurm end-to-end runs (requeue, array, B:, a real
--time) in tests/integration/test_preemption.py.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from distenv import RankInfo, detect
from distenv import preempt as preempt_module
from distenv.errors import ConfigurationError, InvalidVariableError, RequeueError
from distenv.launchers import Scheduler
from distenv.launchers.registry import BUILTIN
from distenv.preempt import requeue, requeue_command, stop_requested, watch_preemption
from tests.conftest import scrubbed_environ
from tests.support.envs import lsf, mpi, slurm, torchrun

SBATCH_1T = slurm.SBATCH_BATCH_1T[0]


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(slurm.SRUN_2N_4T[1], 0, id="slurm-first-run"),
        pytest.param({**slurm.SRUN_2N_4T[1], "SLURM_RESTART_COUNT": "1"}, 1, id="slurm-requeued"),
        pytest.param({**SBATCH_1T, "SLURM_RESTART_COUNT": "2"}, 2, id="slurm-batch-script"),
        pytest.param(torchrun.TORCHRUN_4[1], 0, id="torchrun-first"),
        pytest.param(
            {**torchrun.TORCHRUN_4[1], "TORCHELASTIC_RESTART_COUNT": "3"}, 3, id="torchrun"
        ),
        pytest.param({**lsf.JSRUN_PLAIN_RANK5, "LSB_RESTART": "Y"}, 1, id="lsf-restarted"),
        pytest.param({**lsf.JSRUN_PLAIN_RANK5, "LSB_RESTART": "N"}, 0, id="lsf-flag-n"),
        pytest.param(lsf.BSUB_ONE_SLOT, 0, id="lsf-first"),
        pytest.param({**mpi.OMPI_4[1], "MASTER_ADDR": "h", "MASTER_PORT": "1"}, 0, id="mpi"),
        pytest.param({}, 0, id="none"),
    ],
)
def test_restart_count_comes_from_the_launcher(env: dict[str, str], expected: int) -> None:
    """SLURM_RESTART_COUNT (unset: 0), TORCHELASTIC_RESTART_COUNT, LSB_RESTART=Y (a flag: 1)."""
    assert detect(env=env).restart_count == expected


def test_restart_counts_of_every_layer_add_up() -> None:
    """torchrun (count 0) inside a requeued sbatch job still says it is a restart."""
    env = {**torchrun.TORCHRUN_IN_SRUN_2N[1], "SLURM_RESTART_COUNT": "1"}
    info = detect(env=env)
    assert (info.launcher, info.restart_count) == ("pytorch", 1)


def test_a_malformed_restart_count_is_refused() -> None:
    """A restart count that is no integer names the launcher, the variable and its value."""
    with pytest.raises(InvalidVariableError) as caught:
        detect(env={**slurm.SRUN_2N_4T[1], "SLURM_RESTART_COUNT": "once"})
    assert (caught.value.source, caught.value.variable, caught.value.value) == (
        "slurm",
        "SLURM_RESTART_COUNT",
        "once",
    )


@pytest.mark.parametrize(
    ("env", "command"),
    [
        pytest.param({"SLURM_JOB_ID": "41"}, ["scontrol", "requeue", "41"], id="slurm-plain"),
        # Element 0 of array 40: its own SLURM_JOB_ID equals the array's (measured).
        pytest.param(
            {"SLURM_JOB_ID": "40", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "0"},
            ["scontrol", "requeue", "40_0"],
            id="slurm-array-element-0",
        ),
        pytest.param(
            {"SLURM_JOB_ID": "41", "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "1"},
            ["scontrol", "requeue", "40_1"],
            id="slurm-array-element-1",
        ),
        pytest.param(
            slurm.SRUN_2N_4T[3],
            ["scontrol", "requeue", slurm.SRUN_2N_4T[3]["SLURM_JOB_ID"]],
            id="slurm-step",
        ),
        pytest.param(lsf.BSUB_ONE_SLOT, ["brequeue", "77"], id="lsf"),
        pytest.param(lsf.JSRUN_ARRAY_ELEMENT3, ["brequeue", "5150[3]"], id="lsf-array"),
        pytest.param(
            {**torchrun.TORCHRUN_IN_SRUN_2N[0]},
            ["scontrol", "requeue", torchrun.TORCHRUN_IN_SRUN_2N[0]["SLURM_JOB_ID"]],
            id="torchrun-in-slurm",
        ),
    ],
)
def test_requeue_command_names_exactly_this_job(env: dict[str, str], command: list[str]) -> None:
    """An array element is requeued alone (ARRAY_TASK), never the whole array."""
    assert requeue_command(env) == command


@pytest.mark.parametrize(
    "env", [torchrun.TORCHRUN_4[0], mpi.OMPI_4[0], {}], ids=["torchrun", "mpirun", "none"]
)
def test_requeue_outside_a_scheduler_is_a_clear_error(env: dict[str, str]) -> None:
    """Without Slurm or LSF there is nothing to requeue: say so and how to restart instead."""
    with pytest.raises(RequeueError, match="no scheduler job that can be requeued") as caught:
        requeue_command(env)
    assert "distenv run --max-restarts" in str(caught.value)


def test_only_schedulers_requeue() -> None:
    """The contract: launchers that own no allocation have no requeue command."""
    assert {
        name
        for name, b in BUILTIN.items()
        if not isinstance(b, Scheduler) and hasattr(b, "requeue_command")
    } == set()


@pytest.fixture
def watch_reset() -> Iterator[None]:
    """Leave no handler installed after a test."""
    yield
    if preempt_module._watch is not None:
        preempt_module._watch.uninstall()
        preempt_module._watch = None


@pytest.mark.parametrize("signals", [["KILL"], ["INT"], [9], []])
def test_watch_refuses_signals_it_cannot_handle(
    signals: list[str | int], watch_reset: None
) -> None:
    """Only USR1, USR2 and TERM are warning signals; nothing is installed otherwise."""
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(ConfigurationError, match="USR1, USR2"):
        watch_preemption(signals)
    assert signal.getsignal(signal.SIGUSR1) is before


def test_watch_outside_the_main_thread_is_refused(watch_reset: None) -> None:
    """Python installs signal handlers in the main thread only: say so, not a bare ValueError."""
    caught: list[BaseException] = []

    def watch() -> None:
        try:
            watch_preemption(["USR1"])
        except BaseException as exc:  # handed to the main thread
            caught.append(exc)

    thread = threading.Thread(target=watch, name="loader")
    thread.start()
    thread.join(timeout=30)
    assert len(caught) == 1
    assert isinstance(caught[0], ConfigurationError)
    assert "thread 'loader'" in str(caught[0])


def test_stop_requested_needs_a_watch(watch_reset: None) -> None:
    """Asking before watching is a mistake the loop would never notice: an error."""
    preempt_module._watch = None
    with pytest.raises(ConfigurationError, match="watch_preemption"):
        stop_requested()


@pytest.mark.parametrize("sig", ["USR1", "SIGUSR2", "TERM"])
def test_a_warning_signal_is_noted_not_fatal(sig: str, watch_reset: None) -> None:
    """One process: the signal sets the flag, the next check says stop, and it stays said."""
    watch = watch_preemption([sig])
    assert not stop_requested()
    os.kill(os.getpid(), watch.signals[0])
    assert watch.received == watch.signals[0]
    assert stop_requested()
    assert stop_requested()


def test_every_asks_on_every_nth_call_only(watch_reset: None) -> None:
    """With every=3 a signal is seen at the third call, the same call on every rank."""
    watch_preemption(["USR1"], every=3)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert [stop_requested() for _ in range(3)] == [False, False, True]


def test_watching_installs_nothing_on_import() -> None:
    """`import distenv` (and detection) leave the signal handlers alone."""
    code = (
        "import signal, distenv; distenv.detect(); "
        "print(signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL, "
        "signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=scrubbed_environ(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == ["True", "True"]


def fake_tool(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_a_failed_requeue_names_the_command_and_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """scontrol refusing the requeue is an error with its words, not a silent carry-on."""
    fake_tool(
        tmp_path, "scontrol", 'echo "Requested operation is presently disabled for $2" >&2\nexit 1'
    )
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    with pytest.raises(RequeueError) as caught:
        requeue(timeout=5)
    message = str(caught.value)
    assert "`scontrol requeue 41` exited with status 1" in message
    assert "Requested operation is presently disabled for 41" in message


def test_a_requeue_the_scheduler_never_carries_out_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the job is not ended after an accepted requeue, requeue says so instead of returning."""
    fake_tool(tmp_path, "scontrol", f'echo "$@" > {tmp_path}/called')
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "41")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "40")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    with pytest.raises(RequeueError, match=r"still runs 0\.3s later"):
        requeue(timeout=0.3)
    assert (tmp_path / "called").read_text().split() == ["requeue", "40_1"]


def test_rank_info_default_restart_count_is_zero() -> None:
    """RankInfo built by plug-ins that do not know the field still works (default 0)."""
    assert RankInfo.single("none").restart_count == 0
