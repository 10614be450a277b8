"""Where rank 0's store listens: explicit settings, the host-name mapping and the port formula.

Every launcher backend finds its master the same way:

1. ``MASTER_ADDR`` / ``MASTER_PORT`` from the environment win, unless distenv itself exported them
   for another job or step. distenv tags its exports with ``DISTENV_SCOPE`` (launcher, job, step),
   so values inherited from a stale ``eval "$(distenv export)"`` through ``srun --export=ALL`` are
   recognised and ignored, with a notice.
2. Otherwise the launcher's default host (Slurm: first host of the step) passed through the mapping
   ``DISTENV_MASTER_ADDR_FORMAT`` (e.g. ``{host}-ib``), and a port every rank computes alike from
   the job and step ids: `scheduler_port`.
"""

from __future__ import annotations

import logging
import zlib

from distenv._env import Reader, Var
from distenv._hosts import check_hostname
from distenv.errors import ConfigurationError, InvalidVariableError

__all__ = [
    "MASTER_VARS",
    "PORT_HIGH",
    "PORT_LOW",
    "SCOPE_VAR",
    "explicit_master",
    "map_master_host",
    "master_from_env",
    "scheduler_port",
]

logger = logging.getLogger("distenv")

SCOPE_VAR = "DISTENV_SCOPE"
FORMAT_VAR = "DISTENV_MASTER_ADDR_FORMAT"

MASTER_VARS = (
    Var("MASTER_ADDR", "master_addr", "no", "rank 0's host; set by you, it wins over the default"),
    Var("MASTER_PORT", "master_port", "no", "rank 0's store port; set by you, it wins"),
    Var(
        SCOPE_VAR,
        "(export tag)",
        "no",
        "launcher/job/step that distenv exported MASTER_* for; other scopes' values are ignored",
    ),
    Var(
        FORMAT_VAR,
        "master_addr",
        "no",
        "maps the default master host to the address to use, e.g. '{host}-ib'",
    ),
)

# Ports come from [PORT_LOW, PORT_HIGH): above the registered services most clusters run, and below
# Linux's default ephemeral range (net.ipv4.ip_local_port_range = 32768 60999), so the kernel never
# hands our port to some outgoing connection first.
PORT_LOW = 10_000
PORT_HIGH = 32_768
# Consecutive job ids land PORT_STRIDE ports apart, so two jobs whose ids differ by less than
# (PORT_HIGH - PORT_LOW) / PORT_STRIDE = 234 never collide for any of their first 97 steps.
PORT_STRIDE = 97


def _as_number(text: str) -> int:
    return int(text) if text.isascii() and text.isdigit() else zlib.crc32(text.encode())


def scheduler_port(job_id: str, step: str = "0") -> int:
    """Return the master port every rank of a job step derives alike, without talking.

    ``PORT_LOW + (job * PORT_STRIDE + step) % (PORT_HIGH - PORT_LOW)``; non-numeric ids are hashed
    with CRC-32. Two unrelated jobs sharing a node collide with probability 1/22768.
    """
    span = PORT_HIGH - PORT_LOW
    return PORT_LOW + (_as_number(job_id) * PORT_STRIDE + _as_number(step)) % span


def scope_tag(launcher: str, job_id: str | None, step: str | None) -> str:
    """Return the `DISTENV_SCOPE` value naming one launcher's job step."""
    return f"{launcher}/{job_id or '-'}/{step or '-'}"


def map_master_host(reader: Reader, host: str) -> str:
    """Apply ``DISTENV_MASTER_ADDR_FORMAT`` (``{host}`` is replaced) to a default master host."""
    template = reader.get(FORMAT_VAR)
    if template is None:
        return host
    if "{host}" not in template:
        raise ConfigurationError(
            reader.launcher,
            f"${FORMAT_VAR} is {template!r}, expected a template containing '{{host}}'",
            hint="e.g. DISTENV_MASTER_ADDR_FORMAT='{host}-ib'",
            variable=FORMAT_VAR,
            value=template,
        )
    mapped = template.replace("{host}", host)
    return check_hostname(reader.launcher, FORMAT_VAR, mapped)


def explicit_master(reader: Reader) -> tuple[str | None, int | None]:
    """Return ``MASTER_ADDR`` and ``MASTER_PORT`` from the environment, validated (None if unset)."""
    addr = reader.get("MASTER_ADDR")
    port_text = reader.get("MASTER_PORT")
    port = None
    if port_text is not None:
        port = reader.parse_int("MASTER_PORT", port_text, minimum=1)
        if port > 65535:
            raise InvalidVariableError(
                reader.launcher, "MASTER_PORT", port_text, "a port number in [1, 65535]"
            )
    if addr is not None:
        addr = check_hostname(reader.launcher, "MASTER_ADDR", addr)
    return addr, port


def master_from_env(
    reader: Reader,
    *,
    scope: str,
    default_host: str | None,
    default_port: int | None,
) -> tuple[str | None, int | None]:
    """Return ``(master_addr, master_port)``: explicit values first, else the defaults mapped."""
    tag = reader.get(SCOPE_VAR)
    if (
        tag is not None
        and tag != scope
        and (reader.has("MASTER_ADDR") or reader.has("MASTER_PORT"))
    ):
        logger.warning(
            "%s: ignoring MASTER_ADDR=%s MASTER_PORT=%s: distenv exported them for %s, this is %s",
            reader.launcher,
            reader.get("MASTER_ADDR"),
            reader.get("MASTER_PORT"),
            tag,
            scope,
        )
        addr, port = None, None
    else:
        addr, port = explicit_master(reader)
    if addr is None and default_host is not None:
        addr = map_master_host(reader, default_host)
    return addr, default_port if port is None else port
