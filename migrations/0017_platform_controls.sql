-- Platform: the platform-wide control row (dispatch freeze, session fencing after a restore).
-- depends: 0016_dispatch_heartbeats
-- transactional: false

-- One row for the whole platform (scope = 'PLATFORM'). Claims and starts read it with a shared
-- lock; a freeze or thaw locks it exclusively, so a freeze waits for the claims and starts in
-- flight and every later one sees it (docs/runbooks/restore.md).
CREATE TABLE IF NOT EXISTS orbit_platform_controls (
  scope VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT '控制范围：固定为 PLATFORM（整个平台只有这一行）',
  dispatch_state VARCHAR(16) NOT NULL DEFAULT 'OPEN' COMMENT '派发状态：OPEN 正常派发；FROZEN 全平台冻结派发（领取不授予任何尝试，开始确认一律拒绝，恢复扫描照常进行），用于恢复旧备份后的对账',
  dispatch_reason VARCHAR(1024) NULL COMMENT '最近一次冻结或解冻的原因，由操作者填写',
  dispatch_changed_by VARCHAR(191) NULL COMMENT '最近一次冻结或解冻的操作者身份',
  dispatch_changed_at DATETIME(6) NULL COMMENT '最近一次冻结或解冻的时间（UTC，取数据库时间）',
  sessions_fenced_at DATETIME(6) NULL COMMENT '最近一次隔离全部 Worker 会话的时间（UTC，取数据库时间）：此前创建的会话都被隔离，此前授予的租约都已按丢失处理',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '控制版本：每次冻结、解冻或全部隔离加一',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  PRIMARY KEY (scope),
  CONSTRAINT ck_platform_controls_scope CHECK (scope IN ('PLATFORM')),
  CONSTRAINT ck_platform_controls_dispatch CHECK (dispatch_state IN ('OPEN', 'FROZEN')),
  CONSTRAINT ck_platform_controls_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='平台控制：全平台派发冻结与会话隔离记录（恢复旧备份后使用），只有一行';

INSERT IGNORE INTO orbit_platform_controls (scope, dispatch_state, revision, updated_at)
VALUES ('PLATFORM', 'OPEN', 1, UTC_TIMESTAMP(6));
