-- examples/result-inbox：接收方应用自己数据库里的两张表（不属于 Orbit 的迁移，由接收方自己建）。
-- MySQL 8.4 与 MariaDB 10.11 都能执行；没有外键。
-- python -m result_inbox init-db 执行本文件（语句以单独一行的分号结尾分隔）。

CREATE TABLE IF NOT EXISTS receiver_inbox (
  event_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '结果事件 id（请求体的 event_id）：去重键，同一事件无论投递多少次只应用一次',
  delivery_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '首次应用该事件的投递 id（请求头 webhook-id）',
  subscription VARCHAR(128) NOT NULL COMMENT '投递来自的订阅名',
  namespace VARCHAR(128) NOT NULL COMMENT 'Orbit 命名空间',
  task_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT '任务 id',
  task_revision BIGINT NOT NULL COMMENT '该结果对应的任务版本号',
  state VARCHAR(16) NOT NULL COMMENT '该结果的任务状态',
  outcome VARCHAR(16) NOT NULL
    COMMENT '应用结果：APPLIED 业务视图前进到该版本；STALE 视图已有更高版本，未改动',
  received_at DATETIME(6) NOT NULL COMMENT '应用（提交）时间，UTC',
  PRIMARY KEY (event_id),
  KEY ix_receiver_inbox_task (namespace, task_id),
  CONSTRAINT ck_receiver_inbox_outcome CHECK (outcome IN ('APPLIED', 'STALE'))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='结果收件箱：每个已应用的结果事件一行，与业务视图的更新在同一事务提交'
;

CREATE TABLE IF NOT EXISTS receiver_task_views (
  namespace VARCHAR(128) NOT NULL COMMENT 'Orbit 命名空间',
  task_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT '任务 id',
  queue VARCHAR(128) NOT NULL COMMENT '任务所在队列',
  handler VARCHAR(255) NULL COMMENT '任务的处理器名',
  state VARCHAR(16) NOT NULL COMMENT '最新已知的任务终态（或 NEEDS_REVIEW）',
  task_revision BIGINT NOT NULL COMMENT '视图所反映的任务版本号：只在收到更高版本时前进',
  outcome_reason VARCHAR(255) NULL COMMENT '结束原因（快照的 outcome_reason）',
  attempts_used INT NULL COMMENT '已用尝试次数（快照的 attempts_used）',
  effect_uncertain TINYINT(1) NOT NULL DEFAULT 0 COMMENT '效果是否不确定（快照的 effect_uncertain）',
  result MEDIUMTEXT NULL COMMENT '任务结果 JSON（数字保持原样）',
  error MEDIUMTEXT NULL COMMENT '任务错误 JSON',
  event_id VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL
    COMMENT '最近一次让视图前进的结果事件 id',
  committed_at DATETIME(6) NOT NULL COMMENT '该结果在 Orbit 提交的时间，UTC',
  updated_at DATETIME(6) NOT NULL COMMENT '视图最近一次前进的时间，UTC',
  PRIMARY KEY (namespace, task_id),
  CONSTRAINT ck_receiver_task_views_state
    CHECK (state IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'NEEDS_REVIEW')),
  CONSTRAINT ck_receiver_task_views_result CHECK (result IS NULL OR JSON_VALID(result)),
  CONSTRAINT ck_receiver_task_views_error CHECK (error IS NULL OR JSON_VALID(error))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='业务视图：每个任务的最新结果；版本号只增不减，重复或迟到的投递不会让结果倒退'
;
