"""The transaction runner.

Protocol
--------
A domain transaction is one ``async def body(cur) -> T`` that issues its statements on the cursor
it is given (rows come back as dicts) and never commits; the runner owns the boundaries (the
body's first statement begins the transaction, then COMMIT or ROLLBACK). Everything the body
needs that must stay the same across re-runs -- new ids, the request digest, the idempotency key
-- is computed *before* the runner is called, so every re-run carries the same operation identity.

Failure handling, by where it happens:

* A conflict (deadlock 1213, lock-wait timeout 1205, MariaDB 1020, NOWAIT 3572) anywhere in the
  body: the runner rolls back the whole transaction (1205 only rolled back the statement), waits
  a jittered, growing delay and re-runs the body, at most ``max_attempts`` times.
* The connection is lost *before* COMMIT was sent: the server rolls the transaction back when it
  notices; the runner re-runs the body on a fresh connection (bounded, with backoff).
* The connection is lost *during* COMMIT: the outcome is unknown. The runner never simply
  re-runs. If the caller gave a ``recheck(cur)``, it runs on a fresh connection and looks the
  operation up by its stable identity using a *locking* read (which waits for a commit the
  server may still be finishing); a non-``None`` answer is the committed result, ``None`` means
  the commit did not happen and the body is re-run with the same identity. Without a recheck the
  runner raises :class:`~orbit_common.errors.CommitOutcomeUnknown`.
* Any other error (a domain error, a CHECK or trigger refusal, a programming error): roll back
  and raise. Domain errors stay as they are; driver errors are translated in
  :mod:`orbit_common.db.errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import enum
import logging
import random
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiomysql
import prometheus_client
from pymysql import converters
from pymysql.constants import SERVER_STATUS

from orbit_common import errors
from orbit_common.db import errors as dberrors

T = TypeVar("T")

log = logging.getLogger(__name__)

TX_RETRIES = prometheus_client.Counter(
    "orbit_db_transaction_retries_total",
    "Transactions re-run after a conflict or a lost connection.",
    ["transaction", "reason"],
)
TX_COMMIT_UNKNOWN = prometheus_client.Counter(
    "orbit_db_commit_outcome_unknown_total",
    "Commits whose connection was lost before the server answered.",
    ["transaction", "resolution"],
)
TX_SECONDS = prometheus_client.Histogram(
    "orbit_db_transaction_seconds",
    "Wall time of a transaction including its re-runs.",
    ["transaction"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


_ESCAPE_TABLE = converters._escape_table  # PyMySQL's escape_string table


def _hex(value: bytes) -> str:
    return "X'" + value.hex() + "'"


# What can end or bend a quoted literal (NUL, newline, carriage return, ^Z, quote, backslash).
# A string without any of them is quoted as it is: one C-level scan instead of a per-character
# translate. A double quote needs no escape inside single quotes; PyMySQL escapes it anyway, so
# a string that has one of these goes through PyMySQL's table, double quotes and all.
_BENDS_LITERAL = re.compile(r"[\x00\n\r\x1a'\\]")


def _quoted(value: str) -> str:
    if _BENDS_LITERAL.search(value) is None:
        return "'" + value + "'"
    return "'" + value.translate(_ESCAPE_TABLE) + "'"


def _datetime(value: dt.datetime) -> str:
    # PyMySQL's escape_datetime: the wall-clock fields, microseconds only when set, no zone.
    if value.tzinfo is not None:
        value = value.replace(tzinfo=None)
    return "'" + value.isoformat(" ") + "'"


def _null(value: None) -> str:
    return "NULL"


def _boolean(value: bool) -> str:
    return "1" if value else "0"


# Literals by exact type, each what PyMySQL's escaping writes for it (tests/unit/test_escaping.py
# compares them), in one call instead of three or four; anything else (subclasses such as
# jsondoc's JsonNumber, Decimals, floats) goes through the connection's own escaping.
_LITERALS: dict[type, Callable[[Any], str]] = {
    bytes: _hex, str: _quoted, int: str, type(None): _null, bool: _boolean, dt.datetime: _datetime,
}


class Cursor(aiomysql.DictCursor):  # type: ignore[misc]  # aiomysql is untyped
    """The runner's cursor: dict rows, and parameters turned into literals by exact type.

    PyMySQL escapes ``bytes`` as ``_binary'…'`` through a per-character ``str.translate``; with
    every id a 16-byte value, that was ~15 % of the dispatcher's CPU under load. ``X'…'`` is the
    same binary string to MySQL and MariaDB in every place Orbit binds one (comparisons, IN
    lists, inserts, derived tables) and costs one ``bytes.hex()``. The other common types take
    one call each (:data:`_LITERALS`): a claim, start or finish binds hundreds of parameters per
    statement, and the connection's generic escaping was a fifth of the dispatcher's CPU.
    """

    def _escape_args(self, args: Any, conn: Any) -> Any:
        if isinstance(args, (tuple, list)):
            escape = conn.escape
            if conn.server_status & SERVER_STATUS.SERVER_STATUS_NO_BACKSLASH_ESCAPES:
                return tuple(_hex(arg) if type(arg) is bytes else escape(arg) for arg in args)
            literals = _LITERALS
            return tuple([literal(arg) if (literal := literals.get(type(arg))) is not None
                          else escape(arg) for arg in args])
        return super()._escape_args(args, conn)


class Isolation(enum.Enum):
    """Isolation levels, set per transaction with SET TRANSACTION (portable spelling)."""

    READ_COMMITTED = "READ COMMITTED"
    REPEATABLE_READ = "REPEATABLE READ"


class _Phase(enum.Enum):
    BODY = "body"
    COMMIT = "commit"


class TransactionRunner:
    """Runs domain transactions with the retry rules in the module docstring."""

    def __init__(
        self,
        pool: Any,
        *,
        max_attempts: int = 8,
        base_delay_s: float = 0.005,
        max_delay_s: float = 0.5,
    ) -> None:
        self._pool = pool
        self.max_attempts = max_attempts
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s

    def _delay(self, attempt: int) -> float:
        """Full-jitter exponential backoff."""
        cap = min(self.max_delay_s, self.base_delay_s * (2**attempt))
        return random.uniform(0, cap)  # noqa: S311 - jitter, not security

    async def run(
        self,
        name: str,
        body: Callable[[Any], Awaitable[T]],
        *,
        isolation: Isolation = Isolation.READ_COMMITTED,
        recheck: Callable[[Any], Awaitable[T | None]] | None = None,
    ) -> T:
        with TX_SECONDS.labels(name).time():
            for attempt in range(self.max_attempts):
                outcome = await self._attempt(name, body, isolation, recheck)
                if outcome is not _RETRY:
                    return outcome  # type: ignore[return-value]
                await asyncio.sleep(self._delay(attempt))
            raise errors.TransactionRetriesExhausted(
                f"transaction {name!r} did not commit after {self.max_attempts} attempts"
            )

    async def _attempt(
        self,
        name: str,
        body: Callable[[Any], Awaitable[T]],
        isolation: Isolation,
        recheck: Callable[[Any], Awaitable[T | None]] | None,
    ) -> T | object:
        try:
            conn = await self._pool.acquire()
        except Exception as exc:
            if dberrors.classify(exc) is dberrors.Kind.CONNECTION:
                TX_RETRIES.labels(name, "connect").inc()
                log.warning("transaction %s: cannot connect (%s); retrying", name, exc)
                return _RETRY
            raise
        phase = _Phase.BODY
        broken = False
        lost_commit: BaseException | None = None
        try:
            async with conn.cursor(Cursor) as cur:
                await _begin(conn, cur, isolation)
                result = await body(cur)
            phase = _Phase.COMMIT
            await _commit_even_if_cancelled(conn)
            return result
        except asyncio.CancelledError:
            broken = True  # a statement may be half-sent; never reuse this connection
            raise
        except Exception as exc:
            kind = dberrors.classify(exc)
            if kind is dberrors.Kind.CONNECTION:
                broken = True
                if phase is _Phase.COMMIT:
                    lost_commit = exc  # resolved below, after this connection is released
                else:
                    TX_RETRIES.labels(name, "connection").inc()
                    log.warning("transaction %s: connection lost before commit (%s)", name, exc)
                    return _RETRY
            else:
                broken = not await _rollback(conn)
                if kind is dberrors.Kind.RETRY:
                    TX_RETRIES.labels(name, str(dberrors.errno_of(exc))).inc()
                    return _RETRY
                if isinstance(exc, errors.OrbitError):
                    raise
                raise dberrors.translate(exc) from exc
        finally:
            if broken:
                conn.close()
            self._pool.release(conn)
        return await self._resolve_unknown_commit(name, recheck, lost_commit)

    async def _resolve_unknown_commit(
        self,
        name: str,
        recheck: Callable[[Any], Awaitable[T | None]] | None,
        cause: BaseException,
    ) -> T | object:
        log.warning("transaction %s: connection lost during COMMIT (%s)", name, cause)
        if recheck is None:
            TX_COMMIT_UNKNOWN.labels(name, "raised").inc()
            raise errors.CommitOutcomeUnknown() from cause
        for attempt in range(self.max_attempts):
            found = await self._attempt(f"{name}.recheck", recheck, Isolation.READ_COMMITTED, None)
            if found is _RETRY:
                await asyncio.sleep(self._delay(attempt))
                continue
            if found is not None:
                TX_COMMIT_UNKNOWN.labels(name, "committed").inc()
                return found
            TX_COMMIT_UNKNOWN.labels(name, "not_committed").inc()
            return _RETRY
        TX_COMMIT_UNKNOWN.labels(name, "raised").inc()
        raise errors.CommitOutcomeUnknown() from cause


async def _commit_even_if_cancelled(conn: Any) -> None:
    """COMMIT, and if the caller is cancelled meanwhile, let the COMMIT finish first.

    The outcome write is never abandoned halfway: cancellation (a drain, a client gone) is
    re-raised only once the server has answered, so the outcome is known, not lost.
    """
    commit = asyncio.ensure_future(conn.commit())
    try:
        await asyncio.shield(commit)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await commit
        raise


_SESSION_ISOLATION = "_orbit_session_isolation"


async def _begin(conn: Any, cur: Any, isolation: Isolation) -> None:
    """Ready the connection for the body. No START TRANSACTION: the connections run with
    autocommit off, so the body's first statement begins the transaction (one round trip fewer
    per transaction). Every use of a connection ends in COMMIT or ROLLBACK; one still inside a
    transaction is a bug, logged, and its stray transaction is rolled back first."""
    if conn.get_transaction_status():
        log.error("a pooled connection was inside a transaction; rolling it back")
        await conn.rollback()
    await _set_isolation(conn, cur, isolation)


async def _set_isolation(conn: Any, cur: Any, isolation: Isolation) -> None:
    """READ COMMITTED is made the session default once per connection (one round trip saved
    per transaction); any other level is set for the next transaction only. Both use the
    portable ``SET … TRANSACTION`` spelling: the variable's name differs between servers."""
    if getattr(conn, _SESSION_ISOLATION, None) is not Isolation.READ_COMMITTED:
        await cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        setattr(conn, _SESSION_ISOLATION, Isolation.READ_COMMITTED)
    if isolation is not Isolation.READ_COMMITTED:
        await cur.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation.value}")


async def _rollback(conn: Any) -> bool:
    """Roll back; False when the connection turned out to be unusable."""
    try:
        await conn.rollback()
    except Exception:  # noqa: BLE001 - any failure here means "discard the connection"
        return False
    return True


_RETRY = object()
