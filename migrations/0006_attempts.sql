-- Pulse: attempts, their receipts and late evidence.
-- depends: 0005_tasks
-- transactional: false

CREATE TABLE pulse_attempts (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '尝试 ID：128 位加密随机值',
  task_id BINARY(16) NOT NULL COMMENT '所属任务 ID',
  queue_id BINARY(16) NOT NULL COMMENT '授权时任务所在队列 ID（释放活跃计数用）',
  generation INT NOT NULL COMMENT '执行代次：同一任务内从 1 递增且唯一，旧代次不能覆盖新状态',
  token_digest BINARY(32) NOT NULL COMMENT '租约凭据的 SHA-256：凭据原文只交给 Worker，不落库',
  worker_instance_id BINARY(16) NOT NULL COMMENT '领取该尝试的 Worker 实例 ID',
  worker_session_id BINARY(16) NOT NULL COMMENT '领取该尝试的 Worker 会话 ID',
  state VARCHAR(16) NOT NULL COMMENT '状态：OFFERED 已授予待开始；RUNNING 已批准开始；SUCCEEDED、FAILED、UNKNOWN、CANCELLED 为 Worker 报告的结束；OFFER_EXPIRED、LEASE_EXPIRED、WITHDRAWN 为平台结束',
  offered_at DATETIME(6) NOT NULL COMMENT '授予时间（UTC，数据库时间）',
  started_at DATETIME(6) NULL COMMENT '批准开始时间（UTC）',
  lease_expires_at DATETIME(6) NOT NULL COMMENT '当前租约到期时间（UTC）：OFFERED 时为领取租约，RUNNING 时为执行租约',
  renewals INT NOT NULL DEFAULT 0 COMMENT '续租次数',
  finished_at DATETIME(6) NULL COMMENT '结束时间（UTC）；未结束为空',
  retryable TINYINT(1) NULL COMMENT '失败是否可重试：仅 FAILED 时可为 1，且必须由 Worker 明确声明',
  result MEDIUMTEXT NULL COMMENT 'Worker 报告的成功结果 JSON',
  error MEDIUMTEXT NULL COMMENT 'Worker 报告的错误 JSON 或平台结束原因',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_attempts_generation (namespace_id, task_id, generation),
  KEY ix_attempts_session (namespace_id, worker_session_id, state),
  CONSTRAINT ck_attempts_state CHECK (state IN ('OFFERED', 'RUNNING', 'SUCCEEDED', 'FAILED', 'UNKNOWN', 'CANCELLED', 'OFFER_EXPIRED', 'LEASE_EXPIRED', 'WITHDRAWN')),
  CONSTRAINT ck_attempts_generation CHECK (generation >= 1),
  CONSTRAINT ck_attempts_finished CHECK ((state IN ('OFFERED', 'RUNNING')) = (finished_at IS NULL)),
  CONSTRAINT ck_attempts_started CHECK (state NOT IN ('RUNNING', 'SUCCEEDED', 'FAILED', 'UNKNOWN', 'CANCELLED', 'LEASE_EXPIRED') OR started_at IS NOT NULL),
  CONSTRAINT ck_attempts_retryable CHECK (retryable IS NULL OR retryable = 0 OR state = 'FAILED'),
  CONSTRAINT ck_attempts_result_json CHECK (result IS NULL OR JSON_VALID(result)),
  CONSTRAINT ck_attempts_error_json CHECK (error IS NULL OR JSON_VALID(error))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='执行尝试：每次授权一行，记录代次、Worker、租约、开始与结束，结束后不被覆盖';

CREATE TABLE pulse_attempt_receipts (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '回执 ID：128 位加密随机值',
  attempt_id BINARY(16) NOT NULL COMMENT '所属尝试 ID',
  report_id VARBINARY(128) NOT NULL COMMENT 'Worker 为该报告生成的身份（精确字节）；同一身份的重报返回原回执',
  operation VARCHAR(16) CHARACTER SET ascii NOT NULL COMMENT '报告类型：start 开始、finish 完成',
  request_digest BINARY(32) NOT NULL COMMENT '报告内容的 SHA-256；同身份不同内容视为冲突',
  response MEDIUMTEXT NOT NULL COMMENT '原回执 JSON，重报时原样返回',
  created_at DATETIME(6) NOT NULL COMMENT '受理时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_receipts_report (namespace_id, attempt_id, report_id),
  KEY ix_receipts_operation (namespace_id, attempt_id, operation, request_digest),
  CONSTRAINT ck_receipts_operation CHECK (operation IN ('start', 'finish')),
  CONSTRAINT ck_receipts_response_json CHECK (JSON_VALID(response))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='尝试回执：Worker 报告的去重记录，重报返回原回执';

CREATE TABLE pulse_attempt_evidence (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '证据 ID：128 位加密随机值',
  attempt_id BINARY(16) NOT NULL COMMENT '报告所指的尝试 ID',
  task_id BINARY(16) NOT NULL COMMENT '尝试所属任务 ID',
  generation INT NOT NULL COMMENT '报告携带的执行代次',
  kind VARCHAR(16) NOT NULL COMMENT '迟到报告的类型：SUCCEEDED、FAILED、UNKNOWN、CANCELLED、RENEW',
  retryable TINYINT(1) NULL COMMENT '报告声明的可重试性：仅 FAILED 时可为 1',
  payload MEDIUMTEXT NOT NULL COMMENT '报告内容 JSON（结果或错误），作为人工核查证据保存',
  rejected_because VARCHAR(64) NOT NULL COMMENT '被拒绝的原因，如 attempt_finished、lease_expired、stale_generation',
  received_at DATETIME(6) NOT NULL COMMENT '收到时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, id),
  KEY ix_evidence_attempt (namespace_id, attempt_id, received_at, id),
  KEY ix_evidence_task (namespace_id, task_id, received_at, id),
  CONSTRAINT ck_evidence_kind CHECK (kind IN ('SUCCEEDED', 'FAILED', 'UNKNOWN', 'CANCELLED', 'RENEW')),
  CONSTRAINT ck_evidence_retryable CHECK (retryable IS NULL OR retryable = 0 OR kind = 'FAILED'),
  CONSTRAINT ck_evidence_payload_json CHECK (JSON_VALID(payload))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='迟到证据：无效尝试的报告不改写任务，只作为核查证据保存';
