-- Pulse: an application's usage counters are kept only while it has a count limit.
-- depends: 0010_schedules
-- transactional: false

-- Comments only: without a count limit (max_unfinished_tasks, max_active_attempts,
-- max_reserved_attempts all NULL) no transaction updates these counters, so an application's
-- row is not a lock its whole workload queues behind; the limit change that sets the first one
-- recounts them from the queue counters and the LEASED tasks in the same transaction.
ALTER TABLE orbit_application_resources
  MODIFY COLUMN unfinished_tasks INT NOT NULL DEFAULT 0 COMMENT '当前未终结任务合计：仅在设置了数量上限（未终结、活跃或预占任一）时与提交及终结同事务维护；设置第一个数量上限时按队列计数重算；无数量上限时不维护，用量按队列实时汇总',
  MODIFY COLUMN active_attempts INT NOT NULL DEFAULT 0 COMMENT '当前活跃尝试合计（LEASED 或 RUNNING）：维护规则同 unfinished_tasks',
  MODIFY COLUMN reserved_attempts INT NOT NULL DEFAULT 0 COMMENT '当前未开始预占数（已授予、尚未确认开始）：维护规则同 unfinished_tasks；重算时按 LEASED 任务计数';
