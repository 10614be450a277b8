"""The bootstrap's timing constants, in one table: every wait of `init_dist` and `distenv doctor`.

Seconds unless the name says otherwise. The bootstrap's deadline is the rendezvous timeout
(``DISTENV_TIMEOUT``, ``rendezvous_timeout=``) plus `GRACE_S`; everything else here either divides
that time between the phases or bounds a step that must not eat into it. docs/faults.md explains
how the deadline, the watched thread and the signal path fit together.
"""

__all__ = [
    "FAILED_MARK_S",
    "FIRST_POLL_S",
    "GRACE_S",
    "HOST_FILE_S",
    "KILL_DELAY_S",
    "LOOKUP_S",
    "MARGIN_S",
    "MIN_CONNECT_S",
    "NET_PROBE_S",
    "OUTLIVE_S",
    "POLL_S",
    "PROBE_FIRST_S",
    "PROBE_MAX_S",
    "PROBE_MIN_S",
    "PROBE_TIMEOUT_S",
    "RELEASE_S",
    "SIGNAL_MARK_S",
    "SLICE_S",
    "STOP_S",
    "VERDICT_GRACE_S",
]

# ---- the deadline and the watched thread (distenv.deadline) -------------------------------------
#: Time the bootstrap may take beyond the rendezvous timeout: rank 0 publishes its verdict only
#: after its own wait, and the process group connects after that.
GRACE_S = 10.0
#: Waits that name their own cause end this much before the deadline, so that their message, not
#: the deadline's generic one, is what the user reads.
MARGIN_S = 0.5
#: How long the main thread sleeps between looks at a watched call: a signal is handled within it.
SLICE_S = 0.05
#: How long an abandoned call may take to notice that it is cancelled. A signal's path waits this
#: twice (the abandoned call, then the attempt to tell the others) plus `SIGNAL_MARK_S`: together
#: well inside the 2 s a signal may take to end a rank.
STOP_S = 0.2

# ---- files detection reads (distenv._hosts) ---------------------------------------------------
#: How long reading one host file (PBS's node file, LSF's host and rank files) may take before it
#: is abandoned: on a network file system whose server does not answer, even its open and stat
#: block, for ever. Detection is `init_dist`'s first step, so this fits inside every bootstrap
#: deadline (the rendezvous timeout plus `GRACE_S`, which alone is as long).
HOST_FILE_S = 10.0

# ---- rank states (distenv.bootstrap.session, distenv.bootstrap.group) -----------------------------------------------
#: How long a rank stopped by a signal tries to record that in the store for the others.
SIGNAL_MARK_S = 0.5
#: How long a rank whose init_process_group failed tries to record that for the others.
FAILED_MARK_S = 1.0
#: How long the others may take to read the ranks' states for a message (rank 0's store may be
#: what stopped answering).
LOOKUP_S = 5.0

# ---- reaching rank 0's store (distenv.bootstrap.store) ----------------------------------------------------
#: The first pause between probes of rank 0's port, doubled after each refusal up to `PROBE_MAX_S`:
#: rank 0 usually listens within milliseconds of the others' first probe.
PROBE_FIRST_S = 0.001
PROBE_MAX_S = 1.0
#: The bounds of one probe's connect timeout (the time left, clamped to them).
PROBE_MIN_S = 0.1
PROBE_TIMEOUT_S = 5.0
#: The shortest timeout a TCPStore or init_process_group is given, however little time is left.
MIN_CONNECT_S = 1.0
#: How much longer than its deadline a store client's connect may run in torch: one distenv gave
#: up on must still be blocked when the process ends (`distenv.deadline`), never retrying into
#: the log or returning into a finalising interpreter.
OUTLIVE_S = 60.0

#: How long the roll call's network probe waits for one node's addresses to answer (all are
#: dialled at once): a refusal or a missing route answers at once, a dropped packet never does.
NET_PROBE_S = 1.0
# ---- rank 0 polling its store (distenv.bootstrap.store, distenv.bootstrap.rollcall) ---------------------------
#: Rank 0's first pause between polls of a count; it doubles up to `POLL_S`.
FIRST_POLL_S = 0.0002
#: The longest pause between rank 0's polls (the others wait in the store, without polling), and
#: a waiting rank's pause after a wake-up that found nothing written.
POLL_S = 0.0005
#: How long a rank 0 whose port is taken spends finding out whether another rank 0 of its job's
#: identity holds it (and claiming its rank there): a client's connect and two requests.
COLLISION_PEEK_S = 3.0
#: How long a rank 0 that found two processes of its job's identity keeps its store once its
#: readers have read: two of the others' longest pauses between probes of the port
#: (`PROBE_MAX_S`).
COLLISION_LINGER_S = 2.0
#: How long a failed bootstrap keeps rank 0's store (and a leader its node's socket) after it
#: raised: the others, which stop waiting at the same deadline, read its verdict and states then.
RELEASE_S = 3.0
#: Rank 0 publishes the verdict only after its own wait; the others allow it this much longer.
VERDICT_GRACE_S = 10.0

# ---- the MPI exchange of the master (distenv.detection.exchange) ------------------------------------------
#: Time after the exchange's deadline at which the forked helper (`KillAtDeadline`) kills a rank the
#: Python loop could not end (blocked inside MPI_Init or a broadcast).
KILL_DELAY_S = 1.0
