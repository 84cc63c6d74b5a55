"""Driver-error translation: the one place that knows MySQL/MariaDB error numbers.

Classification is by errno, never by exception class: aiomysql and PyMySQL raise the same
``pymysql.err`` classes, and MariaDB and MySQL use different numbers for the same condition.
"""

from __future__ import annotations

import enum

import pymysql

from orbit_common import errors

# Whole transaction must be re-run: the server rolled back everything (1213, 1020, 3572) or only
# the statement (1205 lock wait timeout) -- in every case the runner rolls back the whole
# transaction itself before re-running it.
ER_LOCK_DEADLOCK = 1213
ER_LOCK_WAIT_TIMEOUT = 1205
ER_CHECKREAD = 1020  # MariaDB: "Record has changed since last read" (snapshot isolation)
ER_LOCK_NOWAIT = 3572
RETRYABLE = frozenset({ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT, ER_CHECKREAD, ER_LOCK_NOWAIT})

ER_DUP_ENTRY = 1062
ER_SIGNAL_EXCEPTION = 1644  # SIGNAL SQLSTATE '45000' from an append-only trigger
ER_CHECK_CONSTRAINT_VIOLATED_MYSQL = 3819
ER_CONSTRAINT_FAILED_MARIADB = 4025
INTEGRITY = frozenset(
    {ER_SIGNAL_EXCEPTION, ER_CHECK_CONSTRAINT_VIOLATED_MYSQL, ER_CONSTRAINT_FAILED_MARIADB}
)

# Client-side connection failures (CR_* codes) and server shutdown.
CR_CONNECTION_ERROR = 2002
CR_CONN_HOST_ERROR = 2003
CR_SERVER_GONE_ERROR = 2006
CR_SERVER_LOST = 2013
CR_COMMANDS_OUT_OF_SYNC = 2014
ER_SERVER_SHUTDOWN = 1053
ER_CON_COUNT_ERROR = 1040
CONNECTION_LOST = frozenset(
    {
        CR_CONNECTION_ERROR,
        CR_CONN_HOST_ERROR,
        CR_SERVER_GONE_ERROR,
        CR_SERVER_LOST,
        CR_COMMANDS_OUT_OF_SYNC,
        ER_SERVER_SHUTDOWN,
        ER_CON_COUNT_ERROR,
    }
)


class Kind(enum.Enum):
    """What the transaction runner should do with a failure."""

    RETRY = "retry"  # conflict with concurrent work: roll back, back off, re-run
    CONNECTION = "connection"  # the connection is gone: outcome depends on where it happened
    DUPLICATE = "duplicate"  # unique key hit: the domain decides (usually "already done")
    INTEGRITY = "integrity"  # CHECK or trigger refused: surface, never retry
    OTHER = "other"


def errno_of(exc: BaseException) -> int | None:
    """The MySQL error number carried by a driver exception, if any."""
    if isinstance(exc, pymysql.err.MySQLError) and exc.args and isinstance(exc.args[0], int):
        return exc.args[0]
    return None


def classify(exc: BaseException) -> Kind:
    """Classify a driver (or socket) exception by its error number."""
    if isinstance(exc, ConnectionError | TimeoutError | EOFError):
        return Kind.CONNECTION
    if isinstance(exc, pymysql.err.InterfaceError):
        return Kind.CONNECTION
    code = errno_of(exc)
    if code is None:
        return Kind.OTHER
    if code in RETRYABLE:
        return Kind.RETRY
    if code in CONNECTION_LOST:
        return Kind.CONNECTION
    if code == ER_DUP_ENTRY:
        return Kind.DUPLICATE
    if code in INTEGRITY:
        return Kind.INTEGRITY
    return Kind.OTHER


def is_duplicate(exc: BaseException, key: str | None = None) -> bool:
    """Whether ``exc`` is a duplicate-key error, optionally on the named unique key."""
    if errno_of(exc) != ER_DUP_ENTRY:
        return False
    if key is None:
        return True
    message = str(exc.args[1]) if len(exc.args) > 1 else ""
    # MySQL 8 says "for key 'table.key'", MariaDB says "for key 'key'".
    return message.endswith(f"'{key}'") or message.endswith(f".{key}'")


def translate(exc: BaseException) -> errors.OrbitError:
    """Turn a driver exception that escaped the domain layer into an Orbit error."""
    kind = classify(exc)
    if kind is Kind.CONNECTION:
        return errors.DatabaseUnavailable()
    if kind is Kind.RETRY:
        return errors.TransactionRetriesExhausted()
    if kind is Kind.INTEGRITY:
        return errors.IntegrityViolation(f"database refused the write (errno {errno_of(exc)})")
    return errors.DatabaseError(f"database error (errno {errno_of(exc)})")
