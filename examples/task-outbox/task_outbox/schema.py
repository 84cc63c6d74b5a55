"""The example's tables, in the sending application's own database (not Orbit's).

``sender_outbox`` is the SDK's table (:data:`orbit_sdk.outbox.SENDER_OUTBOX_DDL`): pending
requests, their leases and their receipts. ``sender_jobs`` is the business table: one row per
job the application wants run, linked to its pending request (``outbox_id``) and, once Orbit
accepted it, to its task (``task_id``). ``sender_workflow_actions`` (module
``task_outbox.workflows``) is the business table of workflow starts and signals. No foreign
keys: the links are checked by the transactions that write them.
"""

from __future__ import annotations

from typing import Any, Final

from orbit_sdk.outbox import OPERATIONS, SENDER_OUTBOX_DDL

from task_outbox.workflows import SENDER_WORKFLOW_ACTIONS_DDL

SENDER_JOBS_DDL: Final = """\
CREATE TABLE IF NOT EXISTS sender_jobs (
  id BINARY(16) NOT NULL COMMENT '业务作业 ID（随机 128 位）',
  name VARCHAR(191) NOT NULL COMMENT '作业名称（业务方给出，便于查看）',
  input MEDIUMTEXT NOT NULL COMMENT '作业参数（JSON），即提交给 Orbit 的任务输入',
  state VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '状态：REQUESTED 已登记待提交、SUBMITTED Orbit 已受理、SUBMIT_FAILED 放弃提交',
  outbox_id BINARY(16) NOT NULL COMMENT '对应的待发请求 ID（sender_outbox.id，无外键）',
  task_id CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL
    COMMENT 'Orbit 任务 ID：与受理回执在同一事务中写入；受理前为 NULL',
  last_error VARCHAR(1024) NULL COMMENT '放弃提交的原因（SUBMIT_FAILED 时）',
  created_at DATETIME(6) NOT NULL COMMENT '登记时间（数据库 UTC 时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后一次状态变化的时间（数据库 UTC 时间）',
  PRIMARY KEY (id),
  KEY ix_sender_jobs_outbox (outbox_id),
  CONSTRAINT ck_sender_jobs_state CHECK (state IN ('REQUESTED', 'SUBMITTED', 'SUBMIT_FAILED')),
  CONSTRAINT ck_sender_jobs_input CHECK (JSON_VALID(input))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='业务作业（示例业务表）：与待发请求同事务创建，受理回执记录时同事务关联 Orbit 任务'
"""

TABLES: Final = (SENDER_OUTBOX_DDL, SENDER_JOBS_DDL, SENDER_WORKFLOW_ACTIONS_DDL)


_OPERATION_CHECK: Final = "ck_sender_outbox_operation"

WIDEN_OPERATIONS: Final = (
    f"ALTER TABLE sender_outbox DROP CONSTRAINT {_OPERATION_CHECK},"
    f" ADD CONSTRAINT {_OPERATION_CHECK} CHECK (operation IN ("
    + ", ".join(f"'{op}'" for op in OPERATIONS) + "))")
"""A ``sender_outbox`` created by an earlier version of the DDL allows ``tasks.submit`` only;
this lets it hold workflow starts and signals too (MySQL 8.4 and MariaDB 10.11)."""


async def init_db(cur: Any) -> None:
    """Create the tables if they do not exist, and widen an earlier ``sender_outbox``'s
    operation check to every operation (DDL commits implicitly in MySQL)."""
    for ddl in TABLES:
        await cur.execute(ddl)
    await cur.execute(
        "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS"
        " WHERE CONSTRAINT_SCHEMA = DATABASE() AND CONSTRAINT_NAME = %s", (_OPERATION_CHECK,))
    row = await cur.fetchone()
    clause = row[0] if isinstance(row, tuple | list) else (row or {}).get("CHECK_CLAUSE")
    if clause is not None and not all(op in str(clause) for op in OPERATIONS):
        await cur.execute(WIDEN_OPERATIONS)
