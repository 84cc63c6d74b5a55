"""Schema checks behind readiness: migrations applied and not dirty, zero foreign keys.

A process never changes the schema; it only refuses to be ready when the schema is not the one
its code was written for. Durability settings are reported (and warned about), not enforced.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import attrs

from orbit_common.db import migrator
from orbit_common.db.pool import Database

log = logging.getLogger(__name__)

COUNT_FOREIGN_KEYS = """
SELECT COUNT(*) AS n FROM information_schema.REFERENTIAL_CONSTRAINTS
WHERE CONSTRAINT_SCHEMA = DATABASE()
"""
LEDGER_EXISTS = """
SELECT COUNT(*) AS n FROM information_schema.TABLES
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'orbit_schema_migrations'
"""
LEDGER = """
SELECT migration_id, checksum, state, steps_total, steps_done, error_text, finished_at
FROM orbit_schema_migrations
"""
DURABILITY = """
SELECT @@innodb_flush_log_at_trx_commit AS flush_log_at_trx_commit, @@log_bin AS log_bin,
       @@sync_binlog AS sync_binlog, @@binlog_format AS binlog_format, VERSION() AS version,
       @@max_allowed_packet AS max_allowed_packet
"""


@attrs.frozen(kw_only=True)
class SchemaReport:
    ready: bool
    problems: tuple[str, ...]
    migrations: dict[str, str]
    foreign_keys: int
    durability: dict[str, Any]
    warnings: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
            "migrations": self.migrations,
            "foreign_keys": self.foreign_keys,
            "durability": self.durability,
        }


def packet_bytes_needed(max_result_bytes: int) -> int:
    """The ``max_allowed_packet`` a finish of ``max_result_bytes`` needs: its statements carry
    every result of the batch once, each byte escaped to at most two, plus up to 256 rows of
    ids and summaries (1 MiB is ample for those)."""
    return 2 * max_result_bytes + 1024 * 1024


def durability_warnings(settings: dict[str, Any], min_packet_bytes: int = 0) -> list[str]:
    warnings = []
    packet = settings.get("max_allowed_packet")
    if packet is not None and int(packet) < min_packet_bytes:
        warnings.append(
            f"max_allowed_packet is {int(packet)} bytes, below the {min_packet_bytes} that"
            " [dispatcher].max_result_bytes needs: a large finish would fail (1153)"
        )
    if int(settings["flush_log_at_trx_commit"]) != 1:
        warnings.append(
            "innodb_flush_log_at_trx_commit is not 1: a crash can lose acknowledged commits"
        )
    if int(settings["log_bin"]) == 1:
        if int(settings["sync_binlog"]) != 1:
            warnings.append("binary log on but sync_binlog is not 1")
        if str(settings["binlog_format"]).upper() != "ROW":
            warnings.append("binary log on but binlog_format is not ROW")
    return warnings


class SchemaChecker:
    """Compares the database with the migration files this process was started with."""

    def __init__(self, db: Database, directory: Path | None = None, *,
                 min_packet_bytes: int = 0) -> None:
        self.db = db
        self.files = migrator.discover(directory)
        self.min_packet_bytes = min_packet_bytes

    async def check(self) -> SchemaReport:
        return await self.db.read("schema.check", self._check)

    async def _check(self, cur: Any) -> SchemaReport:
        await cur.execute(COUNT_FOREIGN_KEYS)
        foreign_keys = int((await cur.fetchone())["n"])
        await cur.execute(DURABILITY)
        settings = dict(await cur.fetchone())
        await cur.execute(LEDGER_EXISTS)
        ledger: dict[str, dict[str, Any]] = {}
        if (await cur.fetchone())["n"]:
            await cur.execute(LEDGER)
            ledger = {row["migration_id"]: row for row in await cur.fetchall()}
        entries = migrator.compare(self.files, ledger)
        problems = [
            f"migration {e.id} is {e.status.value}" + (f" ({e.detail})" if e.detail else "")
            for e in entries
            if e.status not in {migrator.Status.APPLIED, migrator.Status.AHEAD}
        ]
        if foreign_keys:
            problems.append(f"{foreign_keys} foreign keys found; Orbit's schema has none")
        warnings = durability_warnings(settings, self.min_packet_bytes)
        warnings.extend(
            f"migration {e.id} was applied by a newer version; replace this process soon"
            for e in entries
            if e.status is migrator.Status.AHEAD
        )
        return SchemaReport(
            ready=not problems,
            problems=tuple(problems),
            migrations={e.id: e.status.value for e in entries},
            foreign_keys=foreign_keys,
            durability={
                k: (v if isinstance(v, str | int) else str(v)) for k, v in settings.items()
            },
            warnings=tuple(warnings),
        )
