-- Pulse: the retry budget counts approved starts; consecutive lapsed offers are capped; a task
-- may carry a second execution gate (its workflow's).
-- depends: 0017_platform_controls
-- transactional: false

ALTER TABLE pulse_tasks
  ADD COLUMN starts_used INT NOT NULL DEFAULT 0 COMMENT '已批准开始的次数：重试预算（max_attempts）按此计数；未开始即失效或被撤回的派发不计入' AFTER attempts_used;

ALTER TABLE pulse_tasks
  ADD COLUMN offer_lapses INT NOT NULL DEFAULT 0 COMMENT '连续失效（未确认开始即过期）的派发次数：批准开始时清零，达到上限时任务失败（offer_lapses_exhausted）' AFTER starts_used;

ALTER TABLE pulse_tasks
  ADD COLUMN workflow_gate_id BINARY(16) NULL COMMENT '第二执行门控 ID（所属流程实例的门控，pulse_execution_gates）：为空表示只受队列门控；领取与开始同时检查两者' AFTER offer_lapses;

ALTER TABLE pulse_tasks
  ADD CONSTRAINT ck_tasks_budget CHECK (starts_used >= 0 AND offer_lapses >= 0 AND starts_used <= attempts_used);

-- Existing tasks: the starts recorded so far (every attempt that reached RUNNING has started_at).
UPDATE pulse_tasks t
SET t.starts_used = (SELECT COUNT(*) FROM pulse_attempts a
                     WHERE a.namespace_id = t.namespace_id AND a.task_id = t.id
                       AND a.started_at IS NOT NULL);
