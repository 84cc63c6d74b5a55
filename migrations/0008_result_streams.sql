-- Platform: per-namespace result streams and result events.
-- depends: 0007_workers
-- transactional: false

CREATE TABLE orbit_event_streams (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID：每个命名空间一条结果流',
  next_sequence BIGINT NOT NULL COMMENT '下一个待分配的序号：在本行锁下串行分配，保证无间隙',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '状态版本：每次分配加一',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后分配时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id),
  CONSTRAINT ck_event_streams_sequence CHECK (next_sequence >= 1),
  CONSTRAINT ck_event_streams_revision CHECK (revision >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='结果流：命名空间内结果事件的序号分配器，锁顺序中最后获取、持有最短';

CREATE TABLE orbit_result_events (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '结果事件 ID：与对应的原始状态事件（orbit_events）相同',
  sequence BIGINT NOT NULL COMMENT '命名空间内的提交序号：从 1 开始、无间隙、与终态同事务分配',
  task_id BINARY(16) NOT NULL COMMENT '任务 ID',
  queue_id BINARY(16) NOT NULL COMMENT '任务所在队列 ID',
  task_revision BIGINT NOT NULL COMMENT '产生该结果时任务的状态版本',
  state VARCHAR(16) NOT NULL COMMENT '任务的结果状态：SUCCEEDED、FAILED、CANCELLED 或 NEEDS_REVIEW',
  snapshot MEDIUMTEXT NOT NULL COMMENT '冻结的结果快照 JSON：任务摘要、结果或错误；之后不再改变',
  committed_at DATETIME(6) NOT NULL COMMENT '与任务状态同事务写入的时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_result_events_sequence (namespace_id, sequence),
  KEY ix_result_events_task (namespace_id, task_id, task_revision),
  CONSTRAINT ck_result_events_state CHECK (state IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'NEEDS_REVIEW')),
  CONSTRAINT ck_result_events_sequence CHECK (sequence >= 1),
  CONSTRAINT ck_result_events_snapshot_json CHECK (JSON_VALID(snapshot))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='结果事件：不可变的结果快照与无间隙序号，供订阅交付使用';

CREATE TRIGGER trg_orbit_result_events_no_update BEFORE UPDATE ON orbit_result_events FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_result_events is append-only';
