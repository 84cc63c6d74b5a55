-- 控制台身份（规格 000029）：唯一的管理员账号及其会话。
-- depends: 0029_weave_wait_recovery
-- transactional: false

-- 单管理员模型：seat 恒为 1 且唯一，表中至多一行。密码只存 bcrypt 哈希；账号绑定一个 API 凭据，
-- 控制台的每个操作都以该凭据的授权在执行操作的事务内校验。
CREATE TABLE IF NOT EXISTS orbit_console_users (
  id BINARY(16) NOT NULL COMMENT '控制台账号 ID：128 位加密随机值',
  seat TINYINT NOT NULL DEFAULT 1 COMMENT '管理员席位：恒为 1 且唯一，保证单管理员模型（至多一个账号）',
  name VARCHAR(64) COLLATE utf8mb4_bin NOT NULL COMMENT '登录名，按原始字节区分大小写',
  password_hash VARCHAR(60) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT '密码的 bcrypt 哈希（成本不低于 12）；密码原文不落库',
  credential_id BINARY(16) NOT NULL COMMENT '绑定的 API 凭据 ID：控制台操作以该凭据授权；归属由服务层校验，无外键',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '状态版本：从 1 开始，每次设置密码或改绑凭据加一',
  failed_logins INT NOT NULL DEFAULT 0 COMMENT '连续登录失败次数：成功登录或进入限流时清零',
  throttled_until DATETIME(6) NULL COMMENT '登录限流截止时间（UTC，取数据库时间）；此前拒绝一切登录尝试，为空表示未限流',
  password_changed_at DATETIME(6) NOT NULL COMMENT '最近一次设置密码的时间（UTC）；设置密码时吊销全部会话',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  PRIMARY KEY (id),
  UNIQUE KEY uq_console_users_seat (seat),
  UNIQUE KEY uq_console_users_name (name),
  CONSTRAINT ck_console_users_seat CHECK (seat = 1),
  CONSTRAINT ck_console_users_revision CHECK (revision >= 1),
  CONSTRAINT ck_console_users_failed CHECK (failed_logins >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='控制台账号：单管理员，只保存 bcrypt 哈希与绑定凭据，登录失败计数用于限流';

-- 会话令牌只在 HttpOnly Cookie 中，表中只有其 SHA-256 摘要。空闲与绝对过期均以数据库时间判断。
CREATE TABLE IF NOT EXISTS orbit_console_sessions (
  id BINARY(16) NOT NULL COMMENT '会话 ID：128 位加密随机值',
  user_id BINARY(16) NOT NULL COMMENT '所属控制台账号 ID；归属由服务层校验，无外键',
  token_digest BINARY(32) NOT NULL COMMENT '会话令牌的 SHA-256 摘要；令牌原文只在浏览器 Cookie 中，不落库',
  created_at DATETIME(6) NOT NULL COMMENT '登录时间（UTC，取数据库时间）',
  last_seen_at DATETIME(6) NOT NULL COMMENT '最近一次使用时间（UTC）；按间隔批量刷新，用于空闲过期',
  idle_expires_at DATETIME(6) NOT NULL COMMENT '空闲过期时间（UTC）：最近使用时间加空闲时限',
  absolute_expires_at DATETIME(6) NOT NULL COMMENT '绝对过期时间（UTC）：登录时间加绝对时限，不因使用而延长',
  revoked_at DATETIME(6) NULL COMMENT '吊销时间（UTC）：退出登录、设置密码或改绑凭据时写入；有效会话为空',
  revoked_reason VARCHAR(64) NULL COMMENT '吊销原因：logout 退出、password_changed 设置密码',
  client_address VARCHAR(64) NOT NULL DEFAULT '' COMMENT '登录时的客户端地址，仅供审计展示',
  user_agent VARCHAR(255) NOT NULL DEFAULT '' COMMENT '登录时的浏览器标识（截断到 255 字符），仅供审计展示',
  PRIMARY KEY (id),
  UNIQUE KEY uq_console_sessions_token (token_digest),
  KEY ix_console_sessions_user (user_id, revoked_at, created_at),
  CONSTRAINT ck_console_sessions_expiry CHECK (absolute_expires_at >= created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='控制台会话：只保存令牌摘要，空闲与绝对过期，退出或改密即吊销';
