-- Append-only history: raw state events and management audit events.
-- depends: 0002_idempotency_keys
-- transactional: false

CREATE TABLE orbit_events (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID；平台级资源的事件使用全零 ID',
  id BINARY(16) NOT NULL COMMENT '事件 ID：128 位加密随机值',
  aggregate_type VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT '资源类型，如 namespace、task、queue',
  aggregate_id BINARY(16) NOT NULL COMMENT '资源 ID',
  aggregate_revision BIGINT NOT NULL COMMENT '该事件产生后资源的状态版本',
  event_type VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT '事件类型，如 namespace.created、task.accepted',
  from_state VARCHAR(32) NULL COMMENT '转换前状态；创建类事件为空',
  to_state VARCHAR(32) NULL COMMENT '转换后状态；不涉及状态的事件为空',
  payload MEDIUMTEXT NOT NULL COMMENT '事件内容 JSON：资源快照或转换细节',
  occurred_at DATETIME(6) NOT NULL COMMENT '发生时间（UTC，取数据库时间，与状态变更同事务）',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_events_transition (namespace_id, aggregate_type, aggregate_id, aggregate_revision, event_type),
  KEY ix_events_aggregate (namespace_id, aggregate_type, aggregate_id, occurred_at, id),
  CONSTRAINT ck_events_revision CHECK (aggregate_revision >= 1),
  CONSTRAINT ck_events_payload_json CHECK (JSON_VALID(payload))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='原始状态事件：只追加，随状态变更同事务写入，UPDATE 与 DELETE 被触发器拒绝';

CREATE TABLE orbit_audit_events (
  id BINARY(16) NOT NULL COMMENT '审计事件 ID：128 位加密随机值',
  namespace_id BINARY(16) NULL COMMENT '命名空间 ID；平台级操作为空',
  application_id BINARY(16) NULL COMMENT '相关应用 ID；与应用无关时为空',
  actor_kind VARCHAR(16) NOT NULL COMMENT '操作主体类型：credential 凭据、operator 运维命令、console 控制台、system 系统',
  actor_id VARCHAR(191) NOT NULL COMMENT '操作主体身份，如凭据 ID 或运维账号',
  action VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT '管理动作，如 credential.revoke',
  resource_type VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL COMMENT '被操作资源类型',
  resource_id BINARY(16) NULL COMMENT '被操作资源 ID',
  resource_revision BIGINT NULL COMMENT '操作后资源的状态版本',
  reason VARCHAR(1024) NULL COMMENT '操作原因，由操作者填写',
  evidence_ref VARCHAR(1024) NULL COMMENT '证据引用，如工单号或外部核查记录',
  before_doc MEDIUMTEXT NULL COMMENT '操作前资源摘要 JSON',
  after_doc MEDIUMTEXT NULL COMMENT '操作后资源摘要 JSON',
  request_id VARCHAR(64) NULL COMMENT '触发该操作的请求 ID，便于与日志对照',
  occurred_at DATETIME(6) NOT NULL COMMENT '发生时间（UTC，取数据库时间，与被审计的变更同事务）',
  PRIMARY KEY (id),
  KEY ix_audit_namespace (namespace_id, occurred_at, id),
  KEY ix_audit_resource (resource_type, resource_id, occurred_at, id),
  CONSTRAINT ck_audit_actor_kind CHECK (actor_kind IN ('credential', 'operator', 'console', 'system')),
  CONSTRAINT ck_audit_before_json CHECK (before_doc IS NULL OR JSON_VALID(before_doc)),
  CONSTRAINT ck_audit_after_json CHECK (after_doc IS NULL OR JSON_VALID(after_doc))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='管理审计事件：人工干预的身份、原因与前后摘要，只追加，与变更同事务提交';

CREATE TRIGGER trg_orbit_events_no_update BEFORE UPDATE ON orbit_events FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_events is append-only';

CREATE TRIGGER trg_orbit_events_no_delete BEFORE DELETE ON orbit_events FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_events is append-only';

CREATE TRIGGER trg_orbit_audit_events_no_update BEFORE UPDATE ON orbit_audit_events FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_audit_events is append-only';

CREATE TRIGGER trg_orbit_audit_events_no_delete BEFORE DELETE ON orbit_audit_events FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_audit_events is append-only';
