"""The test clusters' job ids never derive one port on the host both clusters share.

Both clusters of tests/harness/setup.sh run their nodes on this host, so a job of one and a job of
the other whose ids derive the same port (`distenv.master.scheduler_port`) collide when they run at
once, as test_templates.py's do: rank 0 of the later one cannot bind, and its other ranks meet the
earlier job's store. The multi cluster's first job id is chosen so that no pair of ids a CI run
reaches (a few thousand jobs on each) meets.
"""

from __future__ import annotations

import re

from distenv.master import PORT_SPAN, scheduler_port
from tests.support.integration.helpers import REPO

SETUP = REPO / "tests" / "harness" / "setup.sh"
# More jobs than a whole CI run submits to either cluster.
JOBS = 5_000


def _first_job_id() -> int:
    (value,) = re.findall(r"^FirstJobId=(\d+)$", SETUP.read_text(), re.M)
    return int(value)


def test_the_two_clusters_jobs_derive_different_ports() -> None:
    """Jobs 1..5000 of cluster one and the first 5000 of multi: their step 0 and step 1 ports are
    disjoint; the old first id (500000) shows what the test catches."""
    first = _first_job_id()

    def meets(base: int) -> set[int]:
        one = {scheduler_port(str(job), str(step)) for job in range(1, JOBS + 1) for step in (0, 1)}
        multi = {
            scheduler_port(str(base + job), str(step)) for job in range(JOBS) for step in (0, 1)
        }
        return one & multi

    assert first > JOBS
    assert meets(first) == set()
    # 500000 = PORT_SPAN * 21 + 22229: job 1486 of one and 502008 of multi both derive 13543.
    assert scheduler_port("1486") == scheduler_port("502008")
    assert meets(500_000) != set()
    assert first % PORT_SPAN == PORT_SPAN // 2
