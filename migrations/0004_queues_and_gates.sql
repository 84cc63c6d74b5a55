-- Pulse: execution gates and queues.
-- depends: 0003_events_and_audit
-- transactional: false

CREATE TABLE pulse_execution_gates (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '门控 ID：128 位加密随机值',
  owner_kind VARCHAR(16) NOT NULL COMMENT '门控所属对象类型：QUEUE 队列；WORKFLOW 流程实例（后续）',
  owner_id BINARY(16) NOT NULL COMMENT '门控所属对象 ID',
  state VARCHAR(16) NOT NULL COMMENT '门控状态：OPEN 允许新的授权与开始；PAUSED 暂停新的授权与开始，在途结果照常记录',
  control_revision BIGINT NOT NULL DEFAULT 1 COMMENT '控制版本：每次暂停/继续加一，领取与开始以共享锁读取以与控制更新串行化',
  reason VARCHAR(1024) NULL COMMENT '最近一次暂停或继续的原因',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_gates_owner (namespace_id, owner_kind, owner_id),
  CONSTRAINT ck_gates_state CHECK (state IN ('OPEN', 'PAUSED')),
  CONSTRAINT ck_gates_owner_kind CHECK (owner_kind IN ('QUEUE', 'WORKFLOW')),
  CONSTRAINT ck_gates_revision CHECK (control_revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='通用执行门控：暂停时阻止新的授权与开始确认，保留在途结果';

CREATE TABLE pulse_queues (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '队列 ID：128 位加密随机值',
  name VARCHAR(128) COLLATE utf8mb4_bin NOT NULL COMMENT '队列名称：命名空间内唯一，按原始字节比较',
  gate_id BINARY(16) NOT NULL COMMENT '该队列的执行门控 ID（pulse_execution_gates）',
  description VARCHAR(512) NOT NULL DEFAULT '' COMMENT '说明文字，仅供展示',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '配置版本：修改配置时条件更新加一；运行计数变化不改变它',
  offer_lease_ms INT NOT NULL COMMENT '默认领取租约（毫秒）：Worker 必须在此期限内确认开始',
  execution_lease_ms INT NOT NULL COMMENT '默认执行租约（毫秒）：Worker 必须在此期限内续租或完成',
  max_attempts INT NOT NULL COMMENT '默认最大尝试次数（含首次）',
  retry_initial_ms INT NOT NULL COMMENT '默认首次重试退避（毫秒）',
  retry_max_ms INT NOT NULL COMMENT '默认重试退避上限（毫秒）',
  retry_multiplier DECIMAL(6,3) NOT NULL COMMENT '默认退避倍数（每次重试乘以该值）',
  retry_jitter DECIMAL(4,3) NOT NULL COMMENT '默认退避抖动比例，0 到 1 之间',
  max_concurrent_attempts INT NULL COMMENT '同时活跃（LEASED 或 RUNNING）的尝试上限；为空表示不限',
  active_attempts INT NOT NULL DEFAULT 0 COMMENT '当前活跃尝试数：与授权、完成、恢复同事务维护，等于重新计数的结果',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改配置时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_queues_name (namespace_id, name),
  CONSTRAINT ck_queues_revision CHECK (revision >= 1),
  CONSTRAINT ck_queues_leases CHECK (offer_lease_ms BETWEEN 100 AND 3600000 AND execution_lease_ms BETWEEN 100 AND 86400000),
  CONSTRAINT ck_queues_attempts CHECK (max_attempts BETWEEN 1 AND 1000),
  CONSTRAINT ck_queues_backoff CHECK (retry_initial_ms >= 0 AND retry_max_ms >= retry_initial_ms AND retry_multiplier >= 1 AND retry_jitter BETWEEN 0 AND 1),
  CONSTRAINT ck_queues_concurrency CHECK (max_concurrent_attempts IS NULL OR max_concurrent_attempts >= 1),
  CONSTRAINT ck_queues_active CHECK (active_attempts >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='队列：任务的派发范围与默认执行策略，暂停通过执行门控实现';
