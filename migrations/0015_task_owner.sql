-- Pulse: the direct owner of a task (a schedule or a workflow), backfilled from the ledger.
-- depends: 0014_event_and_task_indexes
-- transactional: false

-- The CHECK is written so that it is never UNKNOWN (a CHECK passes on UNKNOWN): both columns
-- NULL or both set, and a set kind is one of the list.
ALTER TABLE pulse_tasks
  ADD COLUMN owner_kind VARCHAR(16) NULL COMMENT '直接所有者类型：SCHEDULE 计划触发生成；WORKFLOW 流程步骤生成；普通提交与人工重试为空' AFTER retry_of,
  ADD COLUMN owner_id BINARY(16) NULL COMMENT '直接所有者 ID：SCHEDULE 为计划 ID（触发记录见台账 task_id），WORKFLOW 为流程实例 ID；与 owner_kind 同时为空或同时非空，归属由服务层事务校验，无外键' AFTER owner_kind,
  ADD CONSTRAINT ck_tasks_owner CHECK ((owner_kind IS NULL) = (owner_id IS NULL) AND (owner_kind IS NULL OR owner_kind IN ('SCHEDULE', 'WORKFLOW')));

ALTER TABLE pulse_tasks
  ADD KEY ix_tasks_owner (namespace_id, owner_kind, owner_id);

-- Tasks made by schedule fires before this migration: the ledger row that references the task
-- names its schedule. Safe to re-run (rows already set are left alone).
UPDATE pulse_tasks t
  JOIN pulse_schedule_occurrences o ON o.namespace_id = t.namespace_id AND o.task_id = t.id
SET t.owner_kind = 'SCHEDULE', t.owner_id = o.schedule_id
WHERE t.owner_kind IS NULL;
