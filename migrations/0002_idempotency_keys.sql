-- Idempotency records shared by every command.
-- depends: 0001_platform_identity
-- transactional: false

CREATE TABLE orbit_idempotency_keys (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID；平台级命令（如创建命名空间）使用全零 ID',
  id BINARY(16) NOT NULL COMMENT '幂等记录 ID：128 位加密随机值',
  operation VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT '操作名称，如 namespaces.create',
  scope VARBINARY(255) NOT NULL COMMENT '资源作用域：同一操作内进一步区分幂等范围的精确字节（如应用 ID 或队列名）',
  idem_key VARBINARY(255) NOT NULL COMMENT '调用方提供的幂等键，按原始字节精确匹配',
  request_digest BINARY(32) NOT NULL COMMENT '规范化请求的 SHA-256 摘要；同键不同摘要视为冲突',
  credential_id BINARY(16) NOT NULL COMMENT '首次受理该请求的凭据 ID',
  resource_id BINARY(16) NULL COMMENT '请求产生或作用的资源 ID；没有时为空',
  response_status SMALLINT NOT NULL COMMENT '原响应 HTTP 状态码，重放时原样返回',
  response_body MEDIUMTEXT NOT NULL COMMENT '原响应正文 JSON，重放时原样返回',
  created_at DATETIME(6) NOT NULL COMMENT '受理时间（UTC，取数据库时间）',
  expires_at DATETIME(6) NOT NULL COMMENT '去重窗口截止时间（UTC）；之后可由保留策略清理',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_idempotency_identity (namespace_id, operation, scope, idem_key),
  KEY ix_idempotency_expires (expires_at, namespace_id, id),
  CONSTRAINT ck_idempotency_status CHECK (response_status BETWEEN 100 AND 599),
  CONSTRAINT ck_idempotency_body_json CHECK (JSON_VALID(response_body)),
  CONSTRAINT ck_idempotency_window CHECK (expires_at > created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='提交幂等记录：命名空间、操作、作用域与键唯一，保存请求摘要与原响应';
