-- Platform identity: applications, namespaces and API credentials.
-- transactional: false

CREATE TABLE orbit_applications (
  id BINARY(16) NOT NULL COMMENT '应用 ID：128 位加密随机值，对外为 32 位小写十六进制',
  name VARCHAR(128) COLLATE utf8mb4_bin NOT NULL COMMENT '应用名称：全局唯一，按原始字节区分大小写',
  state VARCHAR(16) NOT NULL COMMENT '状态：ACTIVE 启用；DISABLED 停用，停用后其全部凭据立即失效',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '状态版本：从 1 开始，每次条件更新加一',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  disabled_at DATETIME(6) NULL COMMENT '停用时间（UTC）；启用状态为空',
  PRIMARY KEY (id),
  UNIQUE KEY uq_applications_name (name),
  CONSTRAINT ck_applications_state CHECK (state IN ('ACTIVE', 'DISABLED')),
  CONSTRAINT ck_applications_revision CHECK (revision >= 1),
  CONSTRAINT ck_applications_disabled_at CHECK ((state = 'DISABLED') = (disabled_at IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='应用：租户边界，拥有命名空间、凭据与共享额度';

CREATE TABLE orbit_namespaces (
  id BINARY(16) NOT NULL COMMENT '命名空间 ID：128 位加密随机值',
  application_id BINARY(16) NOT NULL COMMENT '所属应用 ID；归属由服务层事务校验，无外键',
  name VARCHAR(128) COLLATE utf8mb4_bin NOT NULL COMMENT '命名空间名称：全局唯一，出现在 API 路径中',
  description VARCHAR(512) NOT NULL DEFAULT '' COMMENT '说明文字，仅供展示',
  state VARCHAR(16) NOT NULL COMMENT '状态：ACTIVE 启用；DISABLED 停用',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '状态版本：从 1 开始，每次条件更新加一',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  PRIMARY KEY (id),
  UNIQUE KEY uq_namespaces_name (name),
  KEY ix_namespaces_application (application_id, name),
  CONSTRAINT ck_namespaces_state CHECK (state IN ('ACTIVE', 'DISABLED')),
  CONSTRAINT ck_namespaces_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='命名空间：应用内的资源隔离范围，运行实体均以 (namespace_id, id) 为主键';

CREATE TABLE orbit_credentials (
  id BINARY(16) NOT NULL COMMENT '凭据 ID：128 位加密随机值',
  application_id BINARY(16) NOT NULL COMMENT '所属应用 ID；一个凭据只属于一个应用',
  name VARCHAR(128) NOT NULL COMMENT '凭据名称，便于运维识别用途',
  prefix VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT '公开查找前缀：API 密钥中可公开的部分，全局唯一',
  secret_digest BINARY(32) NOT NULL COMMENT '完整 API 密钥的 SHA-256 摘要；密钥原文不落库',
  grants MEDIUMTEXT NOT NULL COMMENT '授权列表 JSON：命名空间 × 动作 × 队列，支持通配符 *',
  state VARCHAR(16) NOT NULL COMMENT '状态：ACTIVE 有效；REVOKED 已吊销，立即失效且不可恢复',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '状态版本：从 1 开始，每次条件更新加一',
  created_by VARCHAR(191) NOT NULL COMMENT '创建者身份（运维命令或凭据 ID）',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  revoked_at DATETIME(6) NULL COMMENT '吊销时间（UTC）；有效状态为空',
  revoked_reason VARCHAR(1024) NULL COMMENT '吊销原因；有效状态为空',
  PRIMARY KEY (id),
  UNIQUE KEY uq_credentials_prefix (prefix),
  KEY ix_credentials_application (application_id, created_at, id),
  CONSTRAINT ck_credentials_state CHECK (state IN ('ACTIVE', 'REVOKED')),
  CONSTRAINT ck_credentials_revision CHECK (revision >= 1),
  CONSTRAINT ck_credentials_grants_json CHECK (JSON_VALID(grants)),
  CONSTRAINT ck_credentials_revoked_at CHECK ((state = 'REVOKED') = (revoked_at IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='API 凭据：仅保存密钥摘要与公开前缀，授权在使用资源的事务内校验';
