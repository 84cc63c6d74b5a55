"""The lease protocol (specification 000 §2–§3, §5), one module per part:

========================  =====================================================================
:mod:`.claim`             WAITING → LEASED: offers with a short lease (step 1 of 2)
:mod:`.start`             LEASED → RUNNING: start approval with an execution lease (step 2 of 2)
:mod:`.renew`             RUNNING: execution lease extension, session adoption
:mod:`.finish`            a worker's report: receipts, late evidence, the decision
:mod:`.recovery`          lapsed leases and passed deadlines
:mod:`.decisions`         the rules, as pure functions of a locked task row and database time
:mod:`.endings`           the one ending writer every path above (and cancel and review) uses
:mod:`.common`            identities, locks, sessions, gates, evidence
========================  =====================================================================

State diagram (task; attempt in brackets)::

    WAITING --claim--> LEASED [OFFERED]
    LEASED --start--> RUNNING [RUNNING]
    LEASED --gate closed at start--> WAITING [WITHDRAWN]
    LEASED --deadline at start--> FAILED | NEEDS_REVIEW [WITHDRAWN]
    LEASED --offer lapsed--> WAITING | FAILED | CANCELLED | NEEDS_REVIEW [OFFER_EXPIRED]
    RUNNING --finish--> SUCCEEDED | WAITING | FAILED | NEEDS_REVIEW | CANCELLED
    RUNNING --lease lost--> WAITING | NEEDS_REVIEW [LEASE_EXPIRED]
    WAITING --deadline--> FAILED | NEEDS_REVIEW

The names below are the protocol's public surface.
"""

from orbit_common.pulse.leases.claim import Grant, any_due, claim, run_claim
from orbit_common.pulse.leases.common import (
    MAX_BATCH,
    AttemptRef,
    BatchTooLarge,
    SessionRef,
    expect_rows,
    task_event,
    token_digest,
)
from orbit_common.pulse.leases.decisions import DEFAULT_MAX_OFFER_LAPSES, Decision
from orbit_common.pulse.leases.finish import (
    OUTCOMES,
    FinishOutcome,
    FinishReport,
    ReportConflict,
    finish,
)
from orbit_common.pulse.leases.finish import validate as finish_validate
from orbit_common.pulse.leases.recovery import expire_waiting, recover_expired
from orbit_common.pulse.leases.renew import RenewOutcome, renew
from orbit_common.pulse.leases.start import StartOutcome, start

__all__ = [
    "DEFAULT_MAX_OFFER_LAPSES", "MAX_BATCH", "OUTCOMES", "AttemptRef", "BatchTooLarge",
    "Decision", "FinishOutcome", "FinishReport", "Grant", "RenewOutcome", "ReportConflict",
    "SessionRef", "StartOutcome", "any_due", "claim", "expect_rows", "expire_waiting",
    "finish", "finish_validate", "recover_expired", "renew", "run_claim", "start", "task_event",
    "token_digest",
]
