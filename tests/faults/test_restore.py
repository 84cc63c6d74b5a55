"""Restoring an old backup of a live database (specification 000 §7, docs/runbooks/restore.md).

The dump is taken while tasks run; they then finish (their effects happened, in the outside
world), and the old dump is restored: the platform believes them RUNNING again, under leases it
thinks valid for a long while. The runbook's steps -- freeze, fence every session and lease, let
the recovery scan reconcile, thaw -- must end with the invariant checker green and no task that
is not re-run-safe executed twice: those in flight at dump time go to NEEDS_REVIEW.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from orbit_common.db.pool import DatabaseUrl
from tests.faults.test_task_faults import (
    assert_invariants,
    compare_effects,
    effects,
    wait_running,
    worker,
)
from tests.support.processes import http, wait_until
from tests.support.stack import DispatcherDaemon, Stack

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXECUTION_LEASE_MS = 30_000  # far longer than the test waits: only fencing can end these leases


@pytest.fixture
def stack(tmp_path: Path) -> Any:
    s = Stack(tmp_path, dispatchers=1)
    try:
        yield s
    finally:
        s.close()


def client_options(url: DatabaseUrl, tmp: Path) -> Path:
    """An option file for the mariadb/mysqldump clients (mode 0600: it holds the password)."""
    path = tmp / "client.cnf"
    lines = ["[client]", f"user={url.user}", f"password={url.password}"]
    if url.unix_socket:
        lines.append(f"socket={url.unix_socket}")
    else:
        lines += [f"host={url.host}", f"port={url.port}", "protocol=TCP"]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def dump(url: DatabaseUrl, tmp: Path) -> Path:
    out = tmp / "backup.sql"
    with out.open("wb") as f:
        subprocess.run(["mariadb-dump", f"--defaults-extra-file={client_options(url, tmp)}",
                        "--single-transaction", "--triggers", url.database],
                       stdout=f, check=True, timeout=60)
    return out


def restore(url: DatabaseUrl, tmp: Path, backup: Path) -> None:
    with backup.open("rb") as f:
        subprocess.run(["mariadb", f"--defaults-extra-file={client_options(url, tmp)}",
                        url.database], stdin=f, check=True, timeout=60)


def orbit_admin(stack: Stack, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ORBIT_")}
    env["ORBIT_DATABASE_URL"] = stack.url.render(hide_password=False)
    done = subprocess.run([sys.executable, "-m", "orbit_cli", "admin", "--actor", "ops@restore",
                           *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def empty_claims(dispatcher: DispatcherDaemon) -> float:
    """Claim transactions of the dispatcher's pool that granted nothing (its operator
    listener's /metrics)."""
    status, _ = http("GET", f"{dispatcher.url}/readyz")
    assert status == 200
    with urllib.request.urlopen(f"{dispatcher.ops_url}/metrics",  # noqa: S310 - loopback
                                timeout=5) as response:
        text = response.read().decode()
    match = re.search(r'^orbit_dispatch_claim_turns_total\{outcome="empty"\} (\S+)$', text,
                      re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def task_states(stack: Stack) -> dict[str, tuple[str, int]]:
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT LOWER(HEX(id)), state, attempts_used FROM pulse_tasks")
        return {row[0]: (row[1], row[2]) for row in cur.fetchall()}


def test_restore_old_dump_freeze_fence_reconcile_thaw(stack: Stack, tmp_path: Path) -> None:
    stack.create_queue("restore", execution_lease_ms=EXECUTION_LEASE_MS, offer_lease_ms=10_000,
                       retry={"max_attempts": 3, "initial_ms": 0, "max_ms": 0,
                              "multiplier": "1", "jitter": "0"})
    unsafe = stack.submit("restore", "sleep", [{"ms": 1500} for _ in range(4)],
                          rerun_safe=False)
    safe = stack.submit("restore", "sleep", [{"ms": 1500} for _ in range(4)], rerun_safe=True)
    worker(stack, tmp_path, "w", queues="restore", concurrency=8)
    wait_running(stack, 8)

    backup = dump(stack.url, tmp_path)  # every task in flight
    states = stack.wait_settled(8, timeout=30)  # ... and then they finish
    assert states == {"SUCCEEDED": 8}
    assert len(effects(tmp_path)) == 8

    # The database is restored with the daemons stopped (the runbook's first step); the worker
    # process keeps running and reconnects when the dispatcher is back.
    old = stack.dispatchers[0]
    old.stop()
    restore(stack.url, tmp_path, backup)
    assert set(stack.states()) == {"RUNNING"}
    # The restored control row is the backup's: open. Hence freeze right after the restore.
    assert '"dispatch": "OPEN"' in orbit_admin(stack, "dispatch", "status")
    frozen = orbit_admin(stack, "dispatch", "freeze", "--reason", "restored the backup")
    assert '"dispatch": "FROZEN"' in frozen
    fenced = orbit_admin(stack, "sessions", "fence-all", "--reason", "restored the backup")
    assert '"leases_expired": 8' in fenced
    stack.dispatchers[0] = DispatcherDaemon(db_url=stack.url, log=tmp_path / "dispatcher-r.log",
                                            port=old.port)
    stack.dispatchers[0].wait_listening()

    # Reconciliation: the recovery scan decides the fenced leases by the usual rules, long
    # before they would have lapsed, while dispatch stays frozen.
    def reconciled() -> dict[str, tuple[str, int]] | None:
        found = task_states(stack)
        return found if not {s for s, _ in found.values()} & {"LEASED", "RUNNING"} else None

    found = wait_until(reconciled, timeout=15, interval=0.1,
                       message="the recovery scan to decide every fenced lease")
    assert {found[t] for t in unsafe} == {("NEEDS_REVIEW", 1)}
    assert {found[t] for t in safe} == {("WAITING", 1)}
    # Frozen: the reconnected worker's claims find the re-run-safe tasks and grant nothing.
    baseline = empty_claims(stack.dispatchers[0])
    wait_until(lambda: empty_claims(stack.dispatchers[0]) >= baseline + 3, timeout=15,
               message="claims to run (and grant nothing) while frozen")
    assert {task_states(stack)[t] for t in safe} == {("WAITING", 1)}

    orbit_admin(stack, "dispatch", "thaw", "--reason", "reconciled")
    states = stack.wait_settled(8, timeout=30)
    assert states == {"SUCCEEDED": 4, "NEEDS_REVIEW": 4}

    runs: dict[str, int] = {}
    for task, _attempt, _generation in effects(tmp_path):
        runs[task] = runs.get(task, 0) + 1
    assert {runs[t] for t in unsafe} == {1}, "a task that is not re-run-safe ran twice"
    assert {runs[t] for t in safe} == {2}  # re-run-safe: run again after the thaw, as declared
    with stack.sql() as conn, conn.cursor() as cur:
        cur.execute("SELECT action, reason FROM orbit_audit_events WHERE actor_id = %s"
                    " ORDER BY occurred_at, id", ("ops@restore",))
        assert cur.fetchall() == (("dispatch.freeze", "restored the backup"),
                                  ("sessions.fence_all", "restored the backup"),
                                  ("dispatch.thaw", "reconciled"))
    compare_effects(stack, tmp_path)
    assert_invariants(stack)
