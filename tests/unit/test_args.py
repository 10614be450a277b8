"""add_launcher_argument: --launcher, and legacy --local_rank from torch.distributed.launch."""

from __future__ import annotations

import argparse

import pytest

from distenv import add_launcher_argument
from distenv.launchers.registry import CHOICES


def make_parser():
    parser = argparse.ArgumentParser(prog="train")
    add_launcher_argument(parser)
    return parser


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        pytest.param([], "auto", id="default"),
        pytest.param(["--launcher", "slurm"], "slurm", id="slurm"),
        pytest.param(["--launcher=torchrun"], "torchrun", id="alias"),
        pytest.param(["--launcher", "none"], "none", id="none"),
    ],
)
def test_launcher_option(argv, launcher):
    """--launcher takes a launcher name or alias, default auto."""
    assert make_parser().parse_args(argv).launcher == launcher


def test_launcher_help_lists_the_registry():
    """The help text lists every name in distenv.launchers.registry.CHOICES."""
    action = next(a for a in make_parser()._actions if a.dest == "launcher")
    assert all(name in action.help for name in CHOICES)
    assert "auto" in CHOICES


def test_unknown_launcher_is_usage_error(capsys):
    """An unknown launcher name exits 2 with argparse's usage error."""
    with pytest.raises(SystemExit) as caught:
        make_parser().parse_args(["--launcher", "cobalt"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "argument --launcher: unknown launcher 'cobalt'. Hint: choose one of auto," in err
    assert "distenv:" not in err  # argparse names the command; no second prefix


def test_a_misspelt_launcher_gets_the_nearest_name(capsys):
    with pytest.raises(SystemExit):
        make_parser().parse_args(["--launcher", "slrum"])
    assert "unknown launcher 'slrum'. Hint: did you mean 'slurm'? Otherwise choose one of" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("argv", "local_rank"),
    [
        pytest.param([], None, id="absent"),
        pytest.param(["--local_rank=3"], 3, id="underscore-equals"),
        pytest.param(["--local-rank", "2"], 2, id="dash-space"),
        pytest.param(["--local-rank=1", "--launcher", "pytorch"], 1, id="with-launcher"),
    ],
)
def test_legacy_local_rank_accepted(argv, local_rank):
    """Both spellings torch.distributed.launch appends parse (dest local_rank) instead of failing."""
    assert make_parser().parse_args(argv).local_rank == local_rank


def test_legacy_local_rank_hidden_from_help():
    """The compatibility option does not clutter --help; --launcher is documented there."""
    text = make_parser().format_help()
    assert "local" not in text
    assert "--launcher NAME" in text


@pytest.mark.parametrize("option", ["--local_rank", "--local-rank"])
def test_existing_local_rank_option_kept(option):
    """A parser that already has a local-rank option keeps it (its default and type)."""
    parser = argparse.ArgumentParser()
    parser.add_argument(option, type=int, default=-1, dest="local_rank")
    add_launcher_argument(parser)
    assert parser.parse_args([]).local_rank == -1
    assert parser.parse_args([f"{option}=5"]).local_rank == 5
