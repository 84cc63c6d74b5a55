-- Pulse: worker instances and sessions.
-- depends: 0006_attempts
-- transactional: false

CREATE TABLE pulse_worker_instances (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT 'Worker 实例 ID：128 位加密随机值',
  instance_key VARBINARY(191) NOT NULL COMMENT 'Worker 自报的稳定实例标识（如主机名加进程标识），命名空间内唯一',
  credential_id BINARY(16) NOT NULL COMMENT '首次注册该实例的凭据 ID',
  session_generation BIGINT NOT NULL DEFAULT 0 COMMENT '会话代次：新会话加一，并隔离同实例的旧会话',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '状态版本：每次条件更新加一',
  created_at DATETIME(6) NOT NULL COMMENT '首次注册时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_worker_instances_key (namespace_id, instance_key),
  CONSTRAINT ck_worker_instances_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='Worker 实例：跨重连稳定的 Worker 身份';

CREATE TABLE pulse_worker_sessions (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '会话 ID：128 位加密随机值',
  instance_id BINARY(16) NOT NULL COMMENT '所属 Worker 实例 ID',
  generation BIGINT NOT NULL COMMENT '会话代次：等于注册时实例的 session_generation',
  credential_id BINARY(16) NOT NULL COMMENT '注册该会话的凭据 ID，派发时重新校验其授权',
  queues MEDIUMTEXT NOT NULL COMMENT '订阅的队列名称 JSON 数组',
  handlers MEDIUMTEXT NOT NULL COMMENT '能处理的处理器名称 JSON 数组',
  max_in_flight INT NOT NULL COMMENT 'Worker 声明的最大并发尝试数',
  state VARCHAR(16) NOT NULL COMMENT '状态：ACTIVE 有效；CLOSED 正常关闭；FENCED 被同实例新会话隔离；EXPIRED 心跳超时',
  dispatcher_node VARCHAR(191) NULL COMMENT '当前承载该会话的派发节点标识，仅用于观测',
  heartbeat_at DATETIME(6) NOT NULL COMMENT '最近心跳时间（UTC，数据库时间）',
  expires_at DATETIME(6) NOT NULL COMMENT '会话到期时间（UTC）：超时未心跳即视为失效',
  created_at DATETIME(6) NOT NULL COMMENT '注册时间（UTC，取数据库时间）',
  closed_at DATETIME(6) NULL COMMENT '结束时间（UTC）；有效会话为空',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_worker_sessions_generation (namespace_id, instance_id, generation),
  KEY ix_worker_sessions_expiry (state, expires_at),
  CONSTRAINT ck_worker_sessions_state CHECK (state IN ('ACTIVE', 'CLOSED', 'FENCED', 'EXPIRED')),
  CONSTRAINT ck_worker_sessions_closed CHECK ((state = 'ACTIVE') = (closed_at IS NULL)),
  CONSTRAINT ck_worker_sessions_queues_json CHECK (JSON_VALID(queues)),
  CONSTRAINT ck_worker_sessions_handlers_json CHECK (JSON_VALID(handlers)),
  CONSTRAINT ck_worker_sessions_in_flight CHECK (max_in_flight BETWEEN 1 AND 10000)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='Worker 会话：一次连接的派发范围与心跳；同实例的新会话隔离旧会话';
