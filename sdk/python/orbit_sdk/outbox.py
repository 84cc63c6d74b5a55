"""The transactional outbox, application side: write a task submission into *your* database in
*your* transaction, send it to Orbit later with its original idempotency key.

Orbit's transaction cannot include the application's (specification 000 §6.1). So the
application writes its business change and a pending request row into its own ``sender_outbox``
table in one local transaction; a sender process (see ``examples/task-outbox`` in the Orbit
repository) later submits each pending request with the idempotency key fixed at write time and
records the acceptance receipt. A sender that crashes after Orbit accepted and before it recorded
the receipt re-sends the same request under the same key and gets the original receipt back.

Three operations: ``tasks.submit`` (a :class:`~orbit_sdk.TaskRequest`), ``workflows.start``
(a :class:`WorkflowStartRequest`) and ``workflows.signal`` (a :class:`SignalRequest`). A row's
``queue`` column is its *lane*, the unit a sender leases by: the task's queue, or the workflow
definition's name for a start or a signal; ``handler`` is the task's handler, the signal's name,
or empty for a start.

This module only writes: :func:`enqueue` / :func:`enqueue_async` take a DB-API style cursor of
the caller's open transaction (anything with ``execute(sql, params)`` using the ``%s``
paramstyle: PyMySQL, aiomysql, mysqlclient, asyncmy) and run one ``INSERT``; they never commit
or roll back. The SDK ships no database driver. :data:`SENDER_OUTBOX_DDL` is the table, which
the application creates itself (it is not part of Orbit's migrations). :func:`send` submits a
stored request with its original key and checks the receipt against it.
"""

from __future__ import annotations

import decimal
import hashlib
import json
import secrets
from collections.abc import Awaitable, Mapping
from typing import Any, Final, Protocol

import attrs

from orbit_sdk import jsonvalue
from orbit_sdk.client import Client, TaskRequest
from orbit_sdk.errors import OrbitError
from orbit_sdk.jsonvalue import RawJson
from orbit_sdk.models import Task
from orbit_sdk.workflows import WorkflowInstance, WorkflowSignal

__all__ = [
    "MAX_SEND_WITHIN_MS",
    "OPERATIONS",
    "OPERATION_SIGNAL",
    "OPERATION_START",
    "OPERATION_SUBMIT",
    "SENDER_OUTBOX_DDL",
    "OutboxEntry",
    "OutboxMismatch",
    "Receipt",
    "SignalRequest",
    "WorkflowStartRequest",
    "enqueue",
    "enqueue_async",
    "new_outbox_key",
    "prepare",
    "send",
]

OPERATION_SUBMIT: Final = "tasks.submit"
"""Submit one task (lane: its queue)."""

OPERATION_START: Final = "workflows.start"
"""Start one workflow instance (lane: the definition's name)."""

OPERATION_SIGNAL: Final = "workflows.signal"
"""Send one signal to a workflow instance (lane: the instance's definition name)."""

OPERATIONS: Final = (OPERATION_SUBMIT, OPERATION_START, OPERATION_SIGNAL)

Receipt = Task | WorkflowInstance | WorkflowSignal
"""Orbit's acceptance receipt of a sent request, by operation."""

MAX_SEND_WITHIN_MS: Final = 6 * 24 * 3600 * 1000
"""The longest total send period: Orbit keeps idempotency records for 7 days, and a re-send
after the record is gone would create a second task."""

SENDER_OUTBOX_DDL: Final = """\
CREATE TABLE IF NOT EXISTS sender_outbox (
  id BINARY(16) NOT NULL COMMENT '待发请求 ID（随机 128 位）',
  operation VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '业务操作：tasks.submit 提交任务、workflows.start 启动流程、workflows.signal 发送信号',
  namespace VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '固定的 Orbit 命名空间：发送者只发送与自己命名空间相同的请求',
  queue VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '固定的发送通道：任务为 Orbit 队列，流程启动与信号为流程定义名称',
  handler VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '任务为处理器名称，信号为信号名称，流程启动为空串',
  input MEDIUMTEXT NOT NULL
    COMMENT '任务输入、流程输入或信号载荷：写入时的紧凑 JSON 文本，每次发送都按原字节发送',
  options MEDIUMTEXT NOT NULL
    COMMENT '其余请求字段（任务选项、流程版本与业务键、信号目标与关联键等）：键已排序的紧凑 JSON',
  idempotency_key VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '原提交键：写入时生成，每次发送都使用它',
  request_digest BINARY(32) NOT NULL
    COMMENT '原请求摘要：操作、命名空间、通道、处理器或信号名、输入与选项的 SHA-256，发送前核对',
  business_table VARCHAR(64) NOT NULL COMMENT '业务关联：业务表名',
  business_id VARCHAR(191) NOT NULL COMMENT '业务关联：业务行 ID',
  state VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '状态：PENDING 待发送、LEASED 发送中、SENT 已受理、FAILED 已放弃（保留不删）',
  attempts INT NOT NULL DEFAULT 0 COMMENT '已领取发送的次数（含结果不明的发送）',
  max_attempts INT NOT NULL COMMENT '发送次数预算：用完后标记为 FAILED',
  generation BIGINT NOT NULL DEFAULT 0 COMMENT '租约代次：每次领取加一',
  lease_token BINARY(16) NULL COMMENT '当前租约令牌：只有持有它且租约未过期的发送者能记录结果',
  wake_at DATETIME(6) NULL
    COMMENT '下次处理时间（数据库 UTC 时间）：待发送为可发送时间，发送中为租约到期，终结为 NULL',
  expires_at DATETIME(6) NOT NULL
    COMMENT '总发送期限（数据库 UTC 时间）：到期后不再发送，标记为 FAILED',
  created_at DATETIME(6) NOT NULL COMMENT '写入时间（数据库 UTC 时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后一次状态变化的时间（数据库 UTC 时间）',
  task_id CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NULL
    COMMENT '原受理回执中的 Orbit 任务 ID（只有 tasks.submit）；受理前为 NULL',
  receipt MEDIUMTEXT NULL
    COMMENT '原受理回执（Orbit 返回的 JSON：任务、流程实例或信号）；受理前为 NULL',
  last_error VARCHAR(1024) NULL COMMENT '最近一次发送失败或放弃的原因',
  PRIMARY KEY (id),
  UNIQUE KEY uq_sender_outbox_key (namespace, queue, idempotency_key),
  KEY ix_sender_outbox_wake (namespace, queue, wake_at),
  KEY ix_sender_outbox_business (business_table, business_id),
  CONSTRAINT ck_sender_outbox_state CHECK (state IN ('PENDING', 'LEASED', 'SENT', 'FAILED')),
  CONSTRAINT ck_sender_outbox_operation
    CHECK (operation IN ('tasks.submit', 'workflows.start', 'workflows.signal')),
  CONSTRAINT ck_sender_outbox_input CHECK (JSON_VALID(input)),
  CONSTRAINT ck_sender_outbox_options CHECK (JSON_VALID(options)),
  CONSTRAINT ck_sender_outbox_receipt CHECK (receipt IS NULL OR JSON_VALID(receipt)),
  CONSTRAINT ck_sender_outbox_budget CHECK (max_attempts >= 1 AND attempts >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='业务侧待发的 Orbit 请求（事务 Outbox）：与业务变更同事务写入，由发送者在事务外发送'
"""
"""The ``sender_outbox`` table (MySQL 8.4 / MariaDB 10.11): run it once in the application's
database, with the application's own schema tooling. Wake-up order is served by
``ix_sender_outbox_wake``; terminal rows have ``wake_at`` NULL and drop out of it."""

_INSERT: Final = """\
INSERT INTO sender_outbox
  (id, operation, namespace, queue, handler, input, options, idempotency_key, request_digest,
   business_table, business_id, state, attempts, max_attempts, generation, wake_at, expires_at,
   created_at, updated_at)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 'PENDING', 0, %s, 0, UTC_TIMESTAMP(6),
        DATE_ADD(UTC_TIMESTAMP(6), INTERVAL %s MICROSECOND), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"""


class Cursor(Protocol):
    """A blocking DB-API cursor of the caller's transaction."""

    def execute(self, query: str, args: Any = ..., /) -> Any: ...


class AsyncCursor(Protocol):
    """An async cursor of the caller's transaction (aiomysql, asyncmy)."""

    def execute(self, query: str, args: Any = ..., /) -> Awaitable[Any]: ...


class OutboxMismatch(OrbitError):
    """A stored request or its receipt does not match the request's fixed identity (namespace,
    queue, handler, digest): the row was changed after it was written, or it belongs to another
    namespace. Sending it would submit something the business transaction never wrote."""

    default_code = "outbox_mismatch"


def new_outbox_key() -> str:
    """A fresh idempotency key for one pending request (fixed at write time)."""
    return f"outbox-{secrets.token_hex(16)}"


@attrs.frozen(kw_only=True)
class WorkflowStartRequest:
    """A workflow start to write into the outbox (the arguments of
    :meth:`~orbit_sdk.Client.start_workflow`). ``input`` is a JSON object (``RawJson`` keeps
    its bytes); ``idempotency_key`` is generated at write time when not given."""

    definition: str
    input: Any = None
    version: int | None = None
    business_key: str | None = None
    idempotency_key: str | None = None

    def parts(self) -> tuple[str, str, str, Any, dict[str, Any]]:
        """``(operation, lane, handler, input, options)`` of its outbox row."""
        if not self.definition:
            raise ValueError("a workflow start names its definition")
        options: dict[str, Any] = {}
        if self.version is not None:
            options["version"] = self.version
        if self.business_key is not None:
            options["business_key"] = self.business_key
        return (OPERATION_START, self.definition, "", {} if self.input is None else self.input,
                options)


@attrs.frozen(kw_only=True)
class SignalRequest:
    """A signal to write into the outbox (the arguments of
    :meth:`~orbit_sdk.Client.send_signal`): to the instance ``workflow_id``, or (without it) to
    the one RUNNING instance of ``definition`` with ``business_key``. ``definition`` is always
    given: it is the row's lane, the unit a sender leases by."""

    definition: str
    name: str
    payload: Any = None
    workflow_id: str | None = None
    business_key: str | None = None
    correlation_key: str | None = None
    payload_version: int = 1
    evidence_ref: str | None = None
    expires_in_ms: int | None = None
    idempotency_key: str | None = None

    def parts(self) -> tuple[str, str, str, Any, dict[str, Any]]:
        """``(operation, lane, handler, input, options)`` of its outbox row."""
        if not self.definition or not self.name:
            raise ValueError("a signal names its definition (its lane) and its name")
        if (self.workflow_id is None) == (self.business_key is None):
            raise ValueError("a signal goes to a workflow_id or to a business_key, one of them")
        options: dict[str, Any] = {"payload_version": self.payload_version}
        for key, value in (("workflow_id", self.workflow_id),
                           ("business_key", self.business_key),
                           ("correlation_key", self.correlation_key),
                           ("evidence_ref", self.evidence_ref),
                           ("expires_in_ms", self.expires_in_ms)):
            if value is not None:
                options[key] = value
        return OPERATION_SIGNAL, self.definition, self.name, self.payload, options


OutboxRequest = TaskRequest | WorkflowStartRequest | SignalRequest
"""What a pending request row can hold."""


def _parts(request: OutboxRequest) -> tuple[str, str, str, Any, dict[str, Any]]:
    if isinstance(request, TaskRequest):
        body = request.to_json()
        queue, handler, task_input = body.pop("queue"), body.pop("handler"), body.pop("input")
        return OPERATION_SUBMIT, queue, handler, task_input, body
    return request.parts()


def _sorted(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list | tuple):
        return [_sorted(v) for v in value]
    return value


def _digest(operation: str, namespace: str, queue: str, handler: str, *, input_json: str,
            options_json: str) -> bytes:
    # A JSON array of the parts: unambiguous, since each part is one JSON value or a string.
    text = jsonvalue.dumps([operation, namespace, queue, handler, RawJson(input_json),
                            RawJson(options_json)])
    return hashlib.sha256(text.encode()).digest()


@attrs.frozen(kw_only=True)
class OutboxEntry:
    """One pending request as written: what every send of it uses, unchanged.

    ``input_json`` is the task input as compact JSON text (numbers exactly as given),
    ``options_json`` the other submit fields with sorted keys; ``request_digest`` covers the
    operation, namespace, queue, handler and both texts.
    """

    id: bytes = attrs.field(repr=lambda v: v.hex())
    operation: str
    namespace: str
    queue: str
    handler: str
    input_json: str
    options_json: str
    idempotency_key: str
    request_digest: bytes = attrs.field(repr=lambda v: v.hex())
    business_table: str
    business_id: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> OutboxEntry:
        """From a ``sender_outbox`` row read as a mapping (column name → value)."""
        def text(name: str) -> str:
            value = row[name]
            return value.decode() if isinstance(value, bytes | bytearray) else str(value)

        return cls(id=bytes(row["id"]), operation=text("operation"), namespace=text("namespace"),
                   queue=text("queue"), handler=text("handler"), input_json=text("input"),
                   options_json=text("options"), idempotency_key=text("idempotency_key"),
                   request_digest=bytes(row["request_digest"]),
                   business_table=text("business_table"), business_id=text("business_id"))

    def digest_matches(self) -> bool:
        """Whether the stored request still hashes to the digest written with it."""
        return secrets.compare_digest(self.request_digest, _digest(
            self.operation, self.namespace, self.queue, self.handler,
            input_json=self.input_json, options_json=self.options_json))

    def options(self) -> dict[str, Any]:
        """The stored submit options (fractional numbers as ``Decimal``, kept exact)."""
        value = json.loads(self.options_json, parse_float=decimal.Decimal)
        if not isinstance(value, dict):
            raise OutboxMismatch("stored options are not a JSON object")
        return value


def prepare(
    request: OutboxRequest,
    *,
    namespace: str,
    business_table: str,
    business_id: str,
    max_attempts: int = 10,
    send_within_ms: int = 24 * 3600 * 1000,
) -> tuple[OutboxEntry, tuple[Any, ...]]:
    """The entry for ``request`` (a task, a workflow start or a signal) and the parameters
    of its ``INSERT`` (pure; no I/O).

    ``request.idempotency_key`` is used when given (for a key derived from the business row);
    otherwise a fresh one is generated. ``max_attempts`` bounds the sends, ``send_within_ms``
    the total send period (counted from the write, database time; at most 6 days).
    """
    if not namespace:
        raise ValueError("namespace is required: a pending request is fixed to one namespace")
    if not business_table or not business_id:
        raise ValueError("business_table and business_id link the request to its business row")
    if max_attempts < 1:
        raise ValueError("max_attempts must be at least 1")
    if not 1 <= send_within_ms <= MAX_SEND_WITHIN_MS:
        raise ValueError(f"send_within_ms must be from 1 to {MAX_SEND_WITHIN_MS}"
                         " (Orbit keeps idempotency records for 7 days)")
    operation, queue, handler, value, options = _parts(request)
    input_json = jsonvalue.dumps(value)
    options_json = jsonvalue.dumps(_sorted(options))
    key = request.idempotency_key or new_outbox_key()
    entry = OutboxEntry(
        id=secrets.token_bytes(16), operation=operation, namespace=namespace,
        queue=queue, handler=handler, input_json=input_json, options_json=options_json,
        idempotency_key=key,
        request_digest=_digest(operation, namespace, queue, handler,
                               input_json=input_json, options_json=options_json),
        business_table=business_table, business_id=business_id,
    )
    params = (entry.id, entry.operation, namespace, queue, handler, input_json, options_json,
              key, entry.request_digest, business_table, business_id, max_attempts,
              send_within_ms * 1000)
    return entry, params


def enqueue(cursor: Cursor, request: OutboxRequest, *, namespace: str, business_table: str,
            business_id: str, max_attempts: int = 10,
            send_within_ms: int = 24 * 3600 * 1000) -> OutboxEntry:
    """Write one pending request into ``sender_outbox`` with the caller's blocking cursor.

    Runs one ``INSERT`` in the caller's transaction and never commits: the request exists
    exactly when the caller's business change commits. See :func:`prepare` for the arguments.
    """
    entry, params = prepare(request, namespace=namespace, business_table=business_table,
                            business_id=business_id, max_attempts=max_attempts,
                            send_within_ms=send_within_ms)
    cursor.execute(_INSERT, params)
    return entry


async def enqueue_async(cursor: AsyncCursor, request: OutboxRequest, *, namespace: str,
                        business_table: str, business_id: str, max_attempts: int = 10,
                        send_within_ms: int = 24 * 3600 * 1000) -> OutboxEntry:
    """:func:`enqueue` for an async cursor (aiomysql, asyncmy); never commits either."""
    entry, params = prepare(request, namespace=namespace, business_table=business_table,
                            business_id=business_id, max_attempts=max_attempts,
                            send_within_ms=send_within_ms)
    await cursor.execute(_INSERT, params)
    return entry


def _check_receipt(entry: OutboxEntry, receipt: Receipt) -> None:
    options = entry.options()
    if isinstance(receipt, Task):
        if receipt.queue != entry.queue or receipt.handler != entry.handler or not receipt.id:
            raise OutboxMismatch(
                f"the receipt (queue {receipt.queue!r}, handler {receipt.handler!r}) is not for"
                f" the stored request (queue {entry.queue!r}, handler {entry.handler!r})")
    elif isinstance(receipt, WorkflowInstance):
        if (not receipt.id or receipt.definition != entry.queue
                or receipt.business_key != options.get("business_key", receipt.business_key)
                or receipt.version != options.get("version", receipt.version)):
            raise OutboxMismatch(
                f"the receipt (definition {receipt.definition!r}, version {receipt.version},"
                f" business key {receipt.business_key!r}) is not for the stored start of"
                f" {entry.queue!r}")
    elif (not receipt.id or receipt.name != entry.handler
          or receipt.workflow_id != options.get("workflow_id", receipt.workflow_id)):
        raise OutboxMismatch(
            f"the receipt (signal {receipt.name!r} to {receipt.workflow_id!r}) is not for the"
            f" stored signal {entry.handler!r}")


async def send(client: Client, entry: OutboxEntry) -> Receipt:
    """Send a stored request with its original idempotency key; returns Orbit's receipt (a
    :class:`~orbit_sdk.models.Task`, :class:`~orbit_sdk.WorkflowInstance` or
    :class:`~orbit_sdk.WorkflowSignal`, by operation).

    Before sending: the client's namespace must be the request's and the stored request must
    match its digest (else :class:`OutboxMismatch`, nothing sent). A repeated send of an
    accepted request returns Orbit's original receipt, checked against the stored request.
    Errors are the client's (:class:`~orbit_sdk.ConnectionFailed`,
    :class:`~orbit_sdk.QueueFull`, …): call this outside any database transaction.
    """
    if entry.operation not in OPERATIONS:
        raise OutboxMismatch(f"unknown outbox operation {entry.operation!r}")
    if entry.namespace != client.namespace:
        raise OutboxMismatch(f"the request is for namespace {entry.namespace!r}, the client"
                             f" sends to {client.namespace!r}")
    if not entry.digest_matches():
        raise OutboxMismatch("the stored request no longer matches its digest")
    # The options were written from the request classes, so their keys are the client
    # method's arguments.
    value = RawJson(entry.input_json)
    receipt: Receipt
    if entry.operation == OPERATION_SUBMIT:
        receipt = await client.submit(entry.queue, entry.handler, value,
                                      idempotency_key=entry.idempotency_key, **entry.options())
    elif entry.operation == OPERATION_START:
        receipt = await client.start_workflow(entry.queue, value,
                                              idempotency_key=entry.idempotency_key,
                                              **entry.options())
    else:
        options = entry.options()
        receipt = await client.send_signal(
            options.pop("workflow_id", None), entry.handler, value,
            definition=entry.queue if "business_key" in options else None,
            idempotency_key=entry.idempotency_key, **options)
    _check_receipt(entry, receipt)
    return receipt
