-- Pulse: flow control -- queue resources, application shared quotas, keyed concurrency.
-- depends: 0008_result_streams
-- transactional: false

ALTER TABLE pulse_queues
  ADD COLUMN max_unfinished_tasks INT NULL COMMENT '未终结任务上限（WAITING、LEASED、RUNNING、NEEDS_REVIEW）；为空表示不限；降额不删除任务' AFTER active_attempts,
  ADD COLUMN unfinished_tasks INT NOT NULL DEFAULT 0 COMMENT '当前未终结任务数：与提交及终结同事务维护，配置变更不重置' AFTER max_unfinished_tasks,
  ADD COLUMN max_starts_per_second INT NULL COMMENT '每秒开始确认上限（一秒窗口，在开始确认时执行）；为空表示不限' AFTER unfinished_tasks,
  ADD COLUMN start_window_until DATETIME(6) NULL COMMENT '当前开始窗口的结束时间（UTC，数据库时间）；为空表示尚无窗口' AFTER max_starts_per_second,
  ADD COLUMN starts_in_window INT NOT NULL DEFAULT 0 COMMENT '当前窗口内已批准的开始数：与开始确认同事务维护' AFTER start_window_until,
  ADD CONSTRAINT ck_queues_unfinished CHECK (unfinished_tasks >= 0 AND (max_unfinished_tasks IS NULL OR max_unfinished_tasks >= 1)),
  ADD CONSTRAINT ck_queues_start_rate CHECK (starts_in_window >= 0 AND (max_starts_per_second IS NULL OR max_starts_per_second >= 1));

UPDATE pulse_queues q
SET q.unfinished_tasks = (
  SELECT COUNT(*) FROM pulse_tasks t
  WHERE t.namespace_id = q.namespace_id AND t.queue_id = q.id
    AND t.state IN ('WAITING', 'LEASED', 'RUNNING', 'NEEDS_REVIEW'));

CREATE TABLE orbit_application_resources (
  application_id BINARY(16) NOT NULL COMMENT '应用 ID：与应用一一对应，身份行与额度行分开',
  max_unfinished_tasks INT NULL COMMENT '应用全部命名空间合计的未终结任务上限；为空表示不限',
  unfinished_tasks INT NOT NULL DEFAULT 0 COMMENT '当前未终结任务合计：与提交及终结同事务维护',
  max_active_attempts INT NULL COMMENT '合计活跃尝试（LEASED 或 RUNNING）上限，在领取时执行；为空表示不限',
  active_attempts INT NOT NULL DEFAULT 0 COMMENT '当前活跃尝试合计：有键尝试只计一次',
  max_reserved_attempts INT NULL COMMENT '合计未开始预占（已授予、尚未确认开始）上限，在领取时执行；为空表示不限',
  reserved_attempts INT NOT NULL DEFAULT 0 COMMENT '当前未开始预占数：授予时加一，开始确认或结束时减一',
  max_starts_per_second INT NULL COMMENT '合计每秒开始确认上限（一秒窗口）；为空表示不限',
  start_window_until DATETIME(6) NULL COMMENT '当前开始窗口的结束时间（UTC，数据库时间）',
  starts_in_window INT NOT NULL DEFAULT 0 COMMENT '当前窗口内已批准的开始数',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '配置版本：修改上限时条件更新加一；用量变化不改变它',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改配置时间（UTC，取数据库时间）',
  PRIMARY KEY (application_id),
  CONSTRAINT ck_app_resources_counts CHECK (unfinished_tasks >= 0 AND active_attempts >= 0 AND reserved_attempts >= 0 AND starts_in_window >= 0),
  CONSTRAINT ck_app_resources_limits CHECK ((max_unfinished_tasks IS NULL OR max_unfinished_tasks >= 1) AND (max_active_attempts IS NULL OR max_active_attempts >= 1) AND (max_reserved_attempts IS NULL OR max_reserved_attempts >= 1) AND (max_starts_per_second IS NULL OR max_starts_per_second >= 1)),
  CONSTRAINT ck_app_resources_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='应用共享额度：一个应用全部命名空间共享的上限与运行计数；锁顺序在队列之后、资源键之前';

INSERT INTO orbit_application_resources (application_id, unfinished_tasks, active_attempts, reserved_attempts, updated_at)
SELECT a.id,
  (SELECT COUNT(*) FROM pulse_tasks t JOIN orbit_namespaces n ON n.id = t.namespace_id
   WHERE n.application_id = a.id AND t.state IN ('WAITING', 'LEASED', 'RUNNING', 'NEEDS_REVIEW')),
  (SELECT COUNT(*) FROM pulse_attempts x JOIN orbit_namespaces n ON n.id = x.namespace_id
   WHERE n.application_id = a.id AND x.state IN ('OFFERED', 'RUNNING')),
  (SELECT COUNT(*) FROM pulse_attempts x JOIN orbit_namespaces n ON n.id = x.namespace_id
   WHERE n.application_id = a.id AND x.state = 'OFFERED'),
  UTC_TIMESTAMP(6)
FROM orbit_applications a;

ALTER TABLE pulse_tasks
  ADD COLUMN concurrency_key VARBINARY(255) NULL COMMENT '资源键：同命名空间内同键最多一个有效许可；按原始 UTF-8 字节精确匹配；可为空' AFTER business_key,
  ADD COLUMN concurrency_key_digest BINARY(32) NULL COMMENT '资源键摘要：域分隔 SHA-256（orbit.concurrency-key.v1），定位资源键行' AFTER concurrency_key,
  ADD CONSTRAINT ck_tasks_concurrency_key CHECK ((concurrency_key IS NULL) = (concurrency_key_digest IS NULL));

ALTER TABLE pulse_attempts
  ADD COLUMN concurrency_token BIGINT NULL COMMENT '资源键 fencing 序号：领取时资源键行 revision 加一后的值；无键为空；同一键严格递增' AFTER token_digest,
  ADD CONSTRAINT ck_attempts_concurrency_token CHECK (concurrency_token IS NULL OR concurrency_token >= 1);

ALTER TABLE pulse_worker_sessions
  ADD COLUMN concurrency_keys TINYINT(1) NOT NULL DEFAULT 1 COMMENT '会话是否接收带资源键的任务（即能把 fencing 序号交给资源端）' AFTER max_in_flight;

CREATE TABLE pulse_concurrency_limits (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '资源键行 ID：128 位加密随机值',
  scope_key VARBINARY(255) NOT NULL COMMENT '资源键原文（精确字节）',
  key_digest BINARY(32) NOT NULL COMMENT '资源键的域分隔 SHA-256：命名空间内唯一',
  max_permits INT NOT NULL DEFAULT 1 COMMENT '最大有效许可数：资源键固定为 1',
  held_permits INT NOT NULL DEFAULT 0 COMMENT '当前有效许可数：与领取、结束、恢复同事务维护',
  revision BIGINT NOT NULL DEFAULT 0 COMMENT 'fencing 序号来源：每次领取与释放加一，从不重置或回绕；达到上限时拒绝新领取',
  created_at DATETIME(6) NOT NULL COMMENT '首次出现该键的时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后领取或释放时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_concurrency_limits_digest (namespace_id, key_digest),
  CONSTRAINT ck_concurrency_limits_permits CHECK (max_permits = 1 AND held_permits BETWEEN 0 AND max_permits),
  CONSTRAINT ck_concurrency_limits_revision CHECK (revision >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='资源键：同命名空间内同一资源键的并发上限与 fencing 序号；行不删除、不重置';

CREATE TABLE pulse_permits (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '许可 ID：128 位加密随机值',
  limit_id BINARY(16) NOT NULL COMMENT '所属资源键行 ID（pulse_concurrency_limits）',
  attempt_id BINARY(16) NOT NULL COMMENT '持有许可的尝试 ID',
  task_id BINARY(16) NOT NULL COMMENT '持有许可的任务 ID',
  token BIGINT NOT NULL COMMENT '授予时的 fencing 序号（等于尝试的 concurrency_token）',
  acquired_at DATETIME(6) NOT NULL COMMENT '授予时间（UTC，数据库时间）',
  released_at DATETIME(6) NULL COMMENT '释放时间（UTC）；有效许可为空',
  release_reason VARCHAR(64) NULL COMMENT '释放原因：尝试结束的状态，如 SUCCEEDED、LEASE_EXPIRED、WITHDRAWN',
  held TINYINT AS (IF(released_at IS NULL, 1, NULL)) STORED COMMENT '有效标记（生成列）：有效为 1、已释放为空，唯一索引保证每键最多一个有效许可',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_permits_held (namespace_id, limit_id, held),
  UNIQUE KEY uq_permits_attempt (namespace_id, attempt_id),
  UNIQUE KEY uq_permits_token (namespace_id, limit_id, token),
  CONSTRAINT ck_permits_token CHECK (token >= 1),
  CONSTRAINT ck_permits_released CHECK ((released_at IS NULL) = (release_reason IS NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='资源键许可：每次有键授予一行，释放后保留作为历史；唯一索引保证同键至多一个有效许可';
