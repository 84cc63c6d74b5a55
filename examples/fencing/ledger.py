"""The resource side of fencing tokens: a ledger that refuses writes from a stale holder.

Each account remembers the largest fencing token (``last_token``) that wrote to it. A write is
one compare-and-set: it applies only if its token is larger, so a holder whose permit was
already handed to a newer attempt -- a paused process, a request still in flight -- cannot
overwrite the newer holder's work. sqlite3 stands in for any database with conditional updates;
the statement is the same in MySQL or PostgreSQL.
"""

from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (
  id TEXT PRIMARY KEY,
  balance INTEGER NOT NULL,
  last_token INTEGER NOT NULL DEFAULT 0  -- the largest fencing token that has written here
)
"""

# One guarded statement: the token check and the write cannot be separated by another writer.
APPLY = """
UPDATE accounts SET balance = balance + :amount, last_token = :token
WHERE id = :id AND last_token < :token
"""


def open_ledger(path: str = ":memory:") -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)  # autocommit: each statement commits
    conn.execute(SCHEMA)
    return conn


def apply(conn: sqlite3.Connection, account: str, amount: int, token: int) -> str:
    """Add ``amount`` if ``token`` is newer than every token seen on ``account``.

    Returns ``"applied"``; ``"already"`` when this token has written already (a retry of the
    same attempt's write: harmless, nothing changes); ``"stale"`` when a newer token has
    written -- the caller's permit is no longer the newest, and its write did not land.
    """
    cursor = conn.execute(APPLY, {"id": account, "amount": amount, "token": token})
    if cursor.rowcount == 1:
        return "applied"
    row = conn.execute("SELECT last_token FROM accounts WHERE id = ?", (account,)).fetchone()
    if row is None:
        raise LookupError(f"no account {account!r}")
    return "already" if row[0] == token else "stale"
