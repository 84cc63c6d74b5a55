-- Relay: deliveries, one per (subscription, result event), and their attempt log (issue 13).
-- depends: 0020_subscriptions
-- transactional: false

CREATE TABLE IF NOT EXISTS orbit_deliveries (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '交付 ID：也是 Webhook 的 webhook-id',
  subscription_id BINARY(16) NOT NULL COMMENT '所属订阅 ID',
  event_id BINARY(16) NOT NULL COMMENT '来源结果事件 ID（orbit_result_events.id）：冻结快照从该事件读取',
  sequence BIGINT NOT NULL COMMENT '来源结果事件在命名空间结果流中的序号',
  task_id BINARY(16) NOT NULL COMMENT '结果所属任务 ID',
  task_revision BIGINT NOT NULL COMMENT '产生该结果时任务的状态版本：接收方据此只前进不回退',
  state VARCHAR(16) NOT NULL COMMENT '交付状态：PENDING 待投递；LEASED 已租用待确认；ACKNOWLEDGED 已确认（终态）；EXHAUSTED 预算耗尽（保留记录，可由运营方追加预算）',
  attempts_used INT NOT NULL DEFAULT 0 COMMENT '已用尝试次数：每次租用加一，追加预算不清零',
  max_attempts INT NOT NULL COMMENT '交付预算：最多尝试次数；运营方追加预算时增加',
  available_at DATETIME(6) NOT NULL COMMENT '最早可再次投递的时间（UTC，取数据库时间）：失败或租约失效后按退避推迟',
  lease_expires_at DATETIME(6) NULL COMMENT '当前租约到期时间（UTC，取数据库时间）：仅 LEASED',
  lease_token_digest BINARY(32) NULL COMMENT '当前（或确认时）租约令牌的 SHA-256 摘要：令牌只交给租用者，不保存明文',
  last_status_code INT NULL COMMENT '最近一次失败的 HTTP 状态码（无响应为空）',
  last_error VARCHAR(1024) NULL COMMENT '最近一次失败的说明或响应体（截断到 1024 个字符）',
  last_duration_ms INT NULL COMMENT '最近一次尝试的耗时（毫秒）',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）：历史查询的排序键，之后不再改变',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  acknowledged_at DATETIME(6) NULL COMMENT '确认时间（UTC，取数据库时间）',
  exhausted_at DATETIME(6) NULL COMMENT '最近一次预算耗尽的时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_deliveries_event (namespace_id, subscription_id, event_id),
  KEY ix_deliveries_history (namespace_id, subscription_id, created_at, id),
  KEY ix_deliveries_state_history (namespace_id, subscription_id, state, created_at, id),
  KEY ix_deliveries_due (namespace_id, subscription_id, state, available_at, sequence),
  KEY ix_deliveries_lease (state, lease_expires_at),
  KEY ix_deliveries_source (namespace_id, event_id, state),
  CONSTRAINT ck_deliveries_state CHECK (state IN ('PENDING', 'LEASED', 'ACKNOWLEDGED', 'EXHAUSTED')),
  CONSTRAINT ck_deliveries_budget CHECK (max_attempts >= 1 AND attempts_used >= 0 AND (state <> 'PENDING' OR attempts_used < max_attempts) AND (state <> 'LEASED' OR attempts_used BETWEEN 1 AND max_attempts)),
  CONSTRAINT ck_deliveries_lease CHECK ((state = 'LEASED') = (lease_expires_at IS NOT NULL) AND (state <> 'LEASED' OR lease_token_digest IS NOT NULL) AND (state <> 'PENDING' OR lease_token_digest IS NULL)),
  CONSTRAINT ck_deliveries_acknowledged CHECK ((state = 'ACKNOWLEDGED') = (acknowledged_at IS NOT NULL)),
  CONSTRAINT ck_deliveries_exhausted CHECK (state <> 'EXHAUSTED' OR exhausted_at IS NOT NULL),
  CONSTRAINT ck_deliveries_sequence CHECK (sequence >= 1 AND task_revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='交付记录：每个（订阅，结果事件）一条，独立的租约、预算、退避与确认状态';

CREATE TABLE IF NOT EXISTS orbit_delivery_attempts (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  delivery_id BINARY(16) NOT NULL COMMENT '交付 ID',
  attempt INT NOT NULL COMMENT '尝试序号：从 1 开始，即租用时的 attempts_used',
  subscription_id BINARY(16) NOT NULL COMMENT '所属订阅 ID',
  outcome VARCHAR(16) NOT NULL COMMENT '尝试结果：ACKNOWLEDGED 已确认；FAILED 失败（消费者拒绝或端点非 2xx / 超时）；LAPSED 租约到期未确认',
  status_code INT NULL COMMENT 'HTTP 状态码（Webhook 有响应时）',
  error VARCHAR(1024) NULL COMMENT '失败说明或响应体（截断到 1024 个字符）',
  duration_ms INT NULL COMMENT '耗时（毫秒）',
  ended_at DATETIME(6) NOT NULL COMMENT '记录时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, delivery_id, attempt),
  CONSTRAINT ck_delivery_attempts_attempt CHECK (attempt >= 1),
  CONSTRAINT ck_delivery_attempts_outcome CHECK (outcome IN ('ACKNOWLEDGED', 'FAILED', 'LAPSED')),
  CONSTRAINT ck_delivery_attempts_duration CHECK (duration_ms IS NULL OR duration_ms >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='交付尝试记录：每次租用的结果，只追加';

CREATE TRIGGER trg_orbit_delivery_attempts_no_update BEFORE UPDATE ON orbit_delivery_attempts FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_delivery_attempts is append-only';

CREATE TRIGGER trg_orbit_delivery_attempts_no_delete BEFORE DELETE ON orbit_delivery_attempts FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_delivery_attempts is append-only';
