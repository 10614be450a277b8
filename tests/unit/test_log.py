"""get_logger: output on chosen ranks only, the rank in each line, no duplicate handlers."""

from __future__ import annotations

import io
import logging

import pytest

import distenv.comm
from distenv import get_logger


@pytest.fixture
def rank(monkeypatch):
    """Pretend to be a given rank: set ``rank.value``; the filter reads it per record."""

    class Rank:
        value = 0

    monkeypatch.setattr(distenv.comm, "known_rank", lambda: Rank.value)
    return Rank


@pytest.fixture
def fresh_name(request):
    """A logger name unique to the test, with its handlers and filters removed afterwards."""
    name = f"test_log.{request.node.name}"
    yield name
    logger = logging.getLogger(name)
    logger.handlers.clear()
    logger.filters.clear()


def capture(logger):
    """Point the logger's distenv handler at a StringIO and return it."""
    stream = io.StringIO()
    (handler,) = logger.handlers
    handler.setStream(stream)
    return stream


def test_only_chosen_ranks_print(rank, fresh_name):
    """With ranks=(0,), rank 0 prints and rank 1 prints nothing; the rank is in the line."""
    logger = get_logger(fresh_name)
    stream = capture(logger)
    logger.info("step %d", 1)
    rank.value = 1
    logger.info("step %d", 2)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith(f" rank0 INFO {fresh_name}: step 1")


def test_all_ranks(rank, fresh_name):
    """ranks=None prints on every rank, each line naming its own."""
    logger = get_logger(fresh_name, ranks=None)
    stream = capture(logger)
    for value in (0, 5):
        rank.value = value
        logger.warning("hi")
    assert [line.split(" ")[2] for line in stream.getvalue().splitlines()] == ["rank0", "rank5"]


def test_idempotent(rank, fresh_name):
    """Calling get_logger again adds no handler and applies the new ranks and level."""
    logger = get_logger(fresh_name, ranks=(0,))
    again = get_logger(fresh_name, ranks=(1,), level=logging.WARNING)
    assert again is logger
    assert len(logger.handlers) == 1
    assert len(logger.filters) == 1
    stream = capture(logger)
    logger.warning("on rank 0")
    rank.value = 1
    logger.info("filtered by level")
    logger.warning("on rank 1")
    assert stream.getvalue().count("\n") == 1
    assert "rank1 WARNING" in stream.getvalue()


def test_child_logger_filtered(rank, fresh_name):
    """Records of a child logger reaching the handler are filtered by rank as well."""
    logger = get_logger(fresh_name)
    stream = capture(logger)
    rank.value = 2
    logging.getLogger(f"{fresh_name}.child").info("hidden")
    rank.value = 0
    logging.getLogger(f"{fresh_name}.child").info("shown")
    assert stream.getvalue().splitlines()[-1].endswith(f"rank0 INFO {fresh_name}.child: shown")
    assert "hidden" not in stream.getvalue()


def test_no_propagation_to_root(rank, fresh_name, caplog):
    """Records do not also reach the root logger, so basicConfig does not print them twice."""
    logger = get_logger(fresh_name)
    capture(logger)
    with caplog.at_level(logging.INFO):
        logger.info("once")
    assert caplog.records == []
