"""The business side of workflow starts and signals: an action row and its pending request in
one transaction, and the action's link to the receipt (or to the give-up) written by the
sender's recording transaction.

A ``sender_workflow_actions`` row is one thing the application wants Orbit to do to a workflow:
``workflow.start`` (start an instance of a definition) or ``signal`` (send a signal to an
instance, by its id or by the definition's business key). :func:`create_start` and
:func:`create_signal` insert it together with its ``sender_outbox`` row (operation
``workflows.start`` / ``workflows.signal``, lane = the definition's name) using the caller's
cursor; the caller commits both or neither. :class:`ActionLink` moves the row to ``ACCEPTED``
with the instance id (and, for a signal, the signal id) in the transaction that records the
receipt, or to ``FAILED`` with the reason.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any, Final

import attrs
from orbit_sdk import WorkflowInstance, WorkflowSignal
from orbit_sdk.outbox import (
    OutboxEntry,
    Receipt,
    SignalRequest,
    WorkflowStartRequest,
    enqueue_async,
)

log = logging.getLogger(__name__)

TABLE: Final = "sender_workflow_actions"

KIND_START: Final = "workflow.start"
KIND_SIGNAL: Final = "signal"

SENDER_WORKFLOW_ACTIONS_DDL: Final = """\
CREATE TABLE IF NOT EXISTS sender_workflow_actions (
  id BINARY(16) NOT NULL COMMENT '业务动作 ID（随机 128 位）',
  kind VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '动作类型：workflow.start 启动流程、signal 发送信号',
  definition VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '流程定义名称（也是待发请求的发送通道）',
  business_key VARCHAR(191) NULL COMMENT '流程业务键：启动时给实例的，或信号按它找实例',
  signal_name VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL
    COMMENT '信号名称（signal 时）；启动为 NULL',
  input MEDIUMTEXT NOT NULL COMMENT '流程输入或信号载荷（JSON），即发送给 Orbit 的内容',
  state VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '状态：REQUESTED 已登记待发送、ACCEPTED Orbit 已受理、FAILED 放弃发送',
  outbox_id BINARY(16) NOT NULL COMMENT '对应的待发请求 ID（sender_outbox.id，无外键）',
  workflow_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL
    COMMENT 'Orbit 流程实例 ID：启动时来自受理回执；信号时为目标实例（按实例发送时写入时已知）',
  signal_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NULL
    COMMENT 'Orbit 信号 ID：与受理回执在同一事务中写入；启动为 NULL',
  last_error VARCHAR(1024) NULL COMMENT '放弃发送的原因（FAILED 时）',
  created_at DATETIME(6) NOT NULL COMMENT '登记时间（数据库 UTC 时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后一次状态变化的时间（数据库 UTC 时间）',
  PRIMARY KEY (id),
  KEY ix_sender_workflow_actions_outbox (outbox_id),
  CONSTRAINT ck_sender_workflow_actions_kind CHECK (kind IN ('workflow.start', 'signal')),
  CONSTRAINT ck_sender_workflow_actions_state CHECK (state IN ('REQUESTED', 'ACCEPTED', 'FAILED')),
  CONSTRAINT ck_sender_workflow_actions_input CHECK (JSON_VALID(input))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='流程动作（示例业务表）：与待发请求同事务创建，受理回执记录时同事务关联实例与信号'
"""


@attrs.frozen(kw_only=True)
class CreatedAction:
    """The action row's id (hex) and the pending request written with it."""

    id: str
    request: OutboxEntry


async def _insert(cur: Any, *, kind: str, request: WorkflowStartRequest | SignalRequest,
                  namespace: str, business_key: str | None, signal_name: str | None,
                  workflow_id: str | None, max_attempts: int,
                  send_within_ms: int) -> CreatedAction:
    action_id = secrets.token_bytes(16)
    entry = await enqueue_async(cur, request, namespace=namespace, business_table=TABLE,
                                business_id=action_id.hex(), max_attempts=max_attempts,
                                send_within_ms=send_within_ms)
    await cur.execute(
        "INSERT INTO sender_workflow_actions (id, kind, definition, business_key, signal_name,"
        " input, state, outbox_id, workflow_id, created_at, updated_at)"
        " VALUES (%s, %s, %s, %s, %s, %s, 'REQUESTED', %s, %s, UTC_TIMESTAMP(6),"
        " UTC_TIMESTAMP(6))",
        (action_id, kind, entry.queue, business_key, signal_name, entry.input_json, entry.id,
         workflow_id))
    return CreatedAction(id=action_id.hex(), request=entry)


async def create_start(cur: Any, request: WorkflowStartRequest, *, namespace: str,
                       max_attempts: int = 10,
                       send_within_ms: int = 24 * 3600 * 1000) -> CreatedAction:
    """Insert a ``workflow.start`` action and its pending request with ``cur`` (the caller's
    transaction; not committed here). Lock order: the new outbox row, then the new action
    row — the order the sender's recording transaction uses too."""
    return await _insert(cur, kind=KIND_START, request=request, namespace=namespace,
                         business_key=request.business_key, signal_name=None,
                         workflow_id=None, max_attempts=max_attempts,
                         send_within_ms=send_within_ms)


async def create_signal(cur: Any, request: SignalRequest, *, namespace: str,
                        max_attempts: int = 10,
                        send_within_ms: int = 24 * 3600 * 1000) -> CreatedAction:
    """Insert a ``signal`` action and its pending request with ``cur`` (the caller's
    transaction; not committed here); same lock order as :func:`create_start`."""
    return await _insert(cur, kind=KIND_SIGNAL, request=request, namespace=namespace,
                         business_key=request.business_key, signal_name=request.name,
                         workflow_id=request.workflow_id, max_attempts=max_attempts,
                         send_within_ms=send_within_ms)


class ActionLink:
    """Moves the ``sender_workflow_actions`` row with its request, inside the sender's
    transaction."""

    table: Final = TABLE

    async def on_sent(self, cur: Any, entry: OutboxEntry, receipt: Receipt) -> None:
        if isinstance(receipt, WorkflowInstance):
            workflow_id, signal_id = receipt.id, None
        elif isinstance(receipt, WorkflowSignal):
            workflow_id, signal_id = receipt.workflow_id, receipt.id
        else:
            raise TypeError(f"a workflow action got a task receipt {receipt.id}")
        await cur.execute(
            "UPDATE sender_workflow_actions SET state = 'ACCEPTED', workflow_id = %s,"
            " signal_id = %s, updated_at = UTC_TIMESTAMP(6)"
            " WHERE id = %s AND outbox_id = %s AND state = 'REQUESTED'",
            (workflow_id, signal_id, bytes.fromhex(entry.business_id), entry.id))
        if cur.rowcount != 1:
            log.warning("action %s of request %s was not REQUESTED; its receipt is kept on the"
                        " request only", entry.business_id, entry.id.hex())

    async def on_failed(self, cur: Any, entry: OutboxEntry, reason: str) -> None:
        await cur.execute(
            "UPDATE sender_workflow_actions SET state = 'FAILED', last_error = %s,"
            " updated_at = UTC_TIMESTAMP(6)"
            " WHERE id = %s AND outbox_id = %s AND state = 'REQUESTED'",
            (reason[:1024], bytes.fromhex(entry.business_id), entry.id))
