-- Weave: workflow definitions, immutable versions and their scopes, instances, steps,
-- activations, pending advances and the internal inbox (issue 14; parts 2 and 3 add timers,
-- signals, polls, pause/stop and manual recovery on these tables).
-- depends: 0021_deliveries
-- transactional: false

CREATE TABLE IF NOT EXISTS weave_definitions (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '流程定义 ID：128 位加密随机值',
  name VARCHAR(128) COLLATE utf8mb4_bin NOT NULL COMMENT '定义名称：命名空间内唯一，按原始字节比较',
  description VARCHAR(512) NOT NULL DEFAULT '' COMMENT '说明文字，仅供展示',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '定义版本号（CAS）：发布新版本时条件更新加一',
  latest_version INT NOT NULL DEFAULT 0 COMMENT '最新已发布版本号：0 表示尚未发布；新实例默认使用此版本',
  created_by_credential_id BINARY(16) NOT NULL COMMENT '创建定义的凭据 ID',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_definitions_name (namespace_id, name),
  CONSTRAINT ck_weave_definitions_revision CHECK (revision >= 1 AND latest_version >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='流程定义：命名空间内按名称唯一，版本另表保存且发布后不可变';

CREATE TABLE IF NOT EXISTS weave_definition_versions (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  definition_id BINARY(16) NOT NULL COMMENT '流程定义 ID（weave_definitions）',
  version INT NOT NULL COMMENT '版本号：定义内从 1 连续递增',
  document MEDIUMTEXT NOT NULL COMMENT '校验通过的定义文档（规范 JSON 文本，摘要即按此字节计算）',
  digest BINARY(32) NOT NULL COMMENT '规范文档的 SHA-256 摘要：实例、版本范围按此核对版本未被篡改',
  created_by_credential_id BINARY(16) NOT NULL COMMENT '发布版本的凭据 ID',
  created_at DATETIME(6) NOT NULL COMMENT '发布时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, definition_id, version),
  CONSTRAINT ck_weave_versions_version CHECK (version >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='流程定义版本：发布后不可变（触发器拒绝修改与删除），实例固定运行启动时的版本';

CREATE TRIGGER trg_weave_definition_versions_no_update BEFORE UPDATE ON weave_definition_versions
  FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'weave_definition_versions is append-only';

CREATE TRIGGER trg_weave_definition_versions_no_delete BEFORE DELETE ON weave_definition_versions
  FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'weave_definition_versions is append-only';

CREATE TABLE IF NOT EXISTS weave_version_scopes (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  definition_id BINARY(16) NOT NULL COMMENT '流程定义 ID',
  version INT NOT NULL COMMENT '版本号',
  digest BINARY(32) NOT NULL COMMENT '发布时版本文档的摘要：读取时与版本行的摘要核对，不一致即拒绝使用',
  queue_ids TEXT NOT NULL COMMENT '该版本 TASK 步骤使用的队列 ID（去重、排序的十六进制 JSON 数组）；只说明范围，本身不构成授权',
  created_at DATETIME(6) NOT NULL COMMENT '写入时间（与版本发布同事务，之后从不修改）',
  PRIMARY KEY (namespace_id, definition_id, version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='版本范围：发布事务内写入的版本所用队列集合与摘要，从不修改';

CREATE TRIGGER trg_weave_version_scopes_no_update BEFORE UPDATE ON weave_version_scopes
  FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'weave_version_scopes is append-only';

CREATE TRIGGER trg_weave_version_scopes_no_delete BEFORE DELETE ON weave_version_scopes
  FOR EACH ROW SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'weave_version_scopes is append-only';

CREATE TABLE IF NOT EXISTS weave_instances (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '流程实例 ID：128 位加密随机值',
  definition_id BINARY(16) NOT NULL COMMENT '流程定义 ID',
  version INT NOT NULL COMMENT '固定的定义版本：实例始终运行启动时的版本',
  version_digest BINARY(32) NOT NULL COMMENT '启动时版本文档的摘要，推进时核对',
  state VARCHAR(16) NOT NULL COMMENT '实例状态（流程自有，不与任务状态混用）：RUNNING 运行中；SUCCEEDED 成功；FAILED 失败；CANCELLED 已取消；PAUSED、STOPPING 留给暂停与停止（后续）',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '实例版本：每次推进或状态变化条件更新加一',
  business_key VARBINARY(512) NULL COMMENT '业务键：按原始字节保存与比较，可为空',
  input MEDIUMTEXT NOT NULL COMMENT '实例输入 JSON（启动时按定义的输入模式校验）',
  output MEDIUMTEXT NULL COMMENT '实例输出 JSON：SUCCEEDED 时写入',
  error TEXT NULL COMMENT '实例错误 JSON（error、cause）：FAILED 或 CANCELLED 时写入',
  gate_id BINARY(16) NOT NULL COMMENT '实例自己的执行门控 ID（pulse_execution_gates，owner_kind = WORKFLOW）',
  started_by_credential_id BINARY(16) NOT NULL COMMENT '启动实例的凭据 ID',
  created_at DATETIME(6) NOT NULL COMMENT '启动时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  completed_at DATETIME(6) NULL COMMENT '进入终态的时间（UTC）；未结束为空',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_instances_gate (namespace_id, gate_id),
  KEY ix_weave_instances_created (namespace_id, created_at, id),
  KEY ix_weave_instances_definition (namespace_id, definition_id, created_at, id),
  KEY ix_weave_instances_state (namespace_id, state, created_at, id),
  KEY ix_weave_instances_business_key (namespace_id, business_key, created_at, id),
  CONSTRAINT ck_weave_instances_state CHECK (state IN ('RUNNING', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'PAUSED', 'STOPPING')),
  CONSTRAINT ck_weave_instances_completed CHECK ((completed_at IS NULL) = (state IN ('RUNNING', 'PAUSED', 'STOPPING'))),
  CONSTRAINT ck_weave_instances_revision CHECK (revision >= 1 AND version >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='流程实例：固定版本、业务键、输入输出与自有执行门控';

CREATE TABLE IF NOT EXISTS weave_steps (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  instance_id BINARY(16) NOT NULL COMMENT '流程实例 ID',
  id BINARY(16) NOT NULL COMMENT '步骤 ID：128 位加密随机值',
  name VARCHAR(128) COLLATE utf8mb4_bin NOT NULL COMMENT '步骤名称（定义中的名称；内部根步骤为 $root）',
  kind VARCHAR(16) NOT NULL COMMENT '步骤类型：ROOT 内部根步骤；TASK、CHOICE、PARALLEL、SUCCEED、FAIL；TIMER、SIGNAL、POLL 留给后续',
  state VARCHAR(16) NOT NULL COMMENT '步骤状态：PENDING 待推进；RUNNING 有活动激活；WAITING 等待（人工复核、计时、信号、轮询）；SUCCEEDED；FAILED；CANCELLED；SKIPPED',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '步骤版本：每次状态变化条件更新加一',
  activation_count INT NOT NULL DEFAULT 0 COMMENT '已创建的激活数：下一次激活的序号为此值加一',
  live_activation_id BINARY(16) NULL COMMENT '当前活动激活 ID：同一步骤同时至多一个活动激活',
  output MEDIUMTEXT NULL COMMENT '步骤结果 JSON（成功时）',
  error TEXT NULL COMMENT '步骤错误 JSON（失败时）',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, instance_id, id),
  UNIQUE KEY uq_weave_steps_name (namespace_id, instance_id, name),
  CONSTRAINT ck_weave_steps_kind CHECK (kind IN ('ROOT', 'TASK', 'CHOICE', 'PARALLEL', 'SUCCEED', 'FAIL', 'TIMER', 'SIGNAL', 'POLL')),
  CONSTRAINT ck_weave_steps_state CHECK (state IN ('PENDING', 'RUNNING', 'WAITING', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'SKIPPED')),
  CONSTRAINT ck_weave_steps_counts CHECK (revision >= 1 AND activation_count >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='流程步骤：实例内按名称唯一，每次运行为一个激活';

CREATE TABLE IF NOT EXISTS weave_activations (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  instance_id BINARY(16) NOT NULL COMMENT '流程实例 ID',
  step_id BINARY(16) NOT NULL COMMENT '步骤 ID（weave_steps）',
  id BINARY(16) NOT NULL COMMENT '激活 ID：128 位加密随机值',
  sequence INT NOT NULL COMMENT '步骤内的激活序号：从 1 连续递增',
  state VARCHAR(16) NOT NULL COMMENT '激活状态：LIVE 活动中；SUCCEEDED；FAILED；CANCELLED；SUPERSEDED 被新激活取代（旧结果保留但不推进）',
  live_step_id BINARY(16) NULL COMMENT '活动标记：LIVE 时等于 step_id，否则为空；唯一索引保证一个步骤只有一个活动激活',
  task_id BINARY(16) NULL COMMENT '为此激活创建的任务 ID（TASK 步骤）；任务的 owner_id 指向实例',
  result_event_id BINARY(16) NULL COMMENT '推进此激活的内部事件 ID（weave_inbox.source_event_id）：按事件身份去重',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  ended_at DATETIME(6) NULL COMMENT '结束时间（UTC）；LIVE 时为空',
  PRIMARY KEY (namespace_id, instance_id, step_id, sequence),
  UNIQUE KEY uq_weave_activations_id (namespace_id, id),
  UNIQUE KEY uq_weave_activations_live (namespace_id, live_step_id),
  UNIQUE KEY uq_weave_activations_task (namespace_id, task_id),
  CONSTRAINT ck_weave_activations_state CHECK (state IN ('LIVE', 'SUCCEEDED', 'FAILED', 'CANCELLED', 'SUPERSEDED')),
  CONSTRAINT ck_weave_activations_live CHECK ((state = 'LIVE') = (live_step_id IS NOT NULL) AND (live_step_id IS NULL OR live_step_id = step_id)),
  CONSTRAINT ck_weave_activations_ended CHECK ((state = 'LIVE') = (ended_at IS NULL)),
  CONSTRAINT ck_weave_activations_sequence CHECK (sequence >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='步骤激活：步骤的每次运行，带序号；同一步骤同时至多一个活动激活';

CREATE TABLE IF NOT EXISTS weave_pending_advances (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '待推进记录 ID：128 位加密随机值',
  instance_id BINARY(16) NOT NULL COMMENT '流程实例 ID',
  step_id BINARY(16) NOT NULL COMMENT '要推进的步骤 ID',
  kind VARCHAR(16) NOT NULL COMMENT '类型：ROOT 根步骤续接（实例启动）；TIMER、SIGNAL、POLL 时钟检查点（后续）；RESUME 暂停后继续（后续）',
  state VARCHAR(16) NOT NULL COMMENT '状态：PENDING 待处理；LEASED 已被引擎租用；DONE 已推进（保留用于审计）',
  due_at DATETIME(6) NOT NULL COMMENT '最早处理时间（UTC）：ROOT 为启动时间，计时器为到期时间',
  lease_owner VARCHAR(128) NULL COMMENT '租用者（引擎副本标识）；未租用为空',
  lease_expires_at DATETIME(6) NULL COMMENT '租约到期时间（UTC，取数据库时间）：过期后可被恢复扫描重新租用',
  attempts INT NOT NULL DEFAULT 0 COMMENT '已租用次数',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  done_at DATETIME(6) NULL COMMENT '推进完成时间（UTC）',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_advances_step (namespace_id, instance_id, step_id, kind),
  KEY ix_weave_advances_due (state, due_at, namespace_id, id),
  KEY ix_weave_advances_lease (state, lease_expires_at, namespace_id, id),
  CONSTRAINT ck_weave_advances_kind CHECK (kind IN ('ROOT', 'TIMER', 'SIGNAL', 'POLL', 'RESUME')),
  CONSTRAINT ck_weave_advances_state CHECK (state IN ('PENDING', 'LEASED', 'DONE')),
  CONSTRAINT ck_weave_advances_lease CHECK ((state = 'LEASED') = (lease_expires_at IS NOT NULL) AND (state = 'DONE') = (done_at IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='流程接续：根步骤续接与时钟检查点，由引擎以 SKIP LOCKED 租用处理';

CREATE TABLE IF NOT EXISTS weave_inbox (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '收件记录 ID：128 位加密随机值',
  source_event_id BINARY(16) NOT NULL COMMENT '来源事件 ID（任务结束的状态事件，orbit_events.id）',
  consumer VARCHAR(32) NOT NULL COMMENT '消费者：当前只有 ENGINE（流程引擎）',
  task_id BINARY(16) NOT NULL COMMENT '来源任务 ID',
  task_revision BIGINT NOT NULL COMMENT '任务结束后的版本：引擎按此与激活去重',
  task_state VARCHAR(16) NOT NULL COMMENT '任务结束状态：SUCCEEDED、FAILED、CANCELLED、NEEDS_REVIEW',
  instance_id BINARY(16) NULL COMMENT '任务所属流程实例 ID（pulse_tasks.owner_id）；链接不完整时可为空',
  activation_id BINARY(16) NULL COMMENT '任务所属激活 ID（weave_activations.task_id 反查）；链接不完整时为空',
  snapshot MEDIUMTEXT NOT NULL COMMENT '冻结快照 JSON：结束时的任务结果或错误，独立于任务行保存',
  state VARCHAR(16) NOT NULL COMMENT '状态：PENDING 待消费；LEASED 已被引擎租用；CONSUMED 已消费；QUARANTINED 链接不完整，隔离待人工处理，从不猜测',
  quarantine_reason VARCHAR(64) NULL COMMENT '隔离原因代码（仅 QUARANTINED）：missing_instance_link、missing_gate_link、missing_activation 等',
  lease_owner VARCHAR(128) NULL COMMENT '租用者（引擎副本标识）；未租用为空',
  lease_expires_at DATETIME(6) NULL COMMENT '租约到期时间（UTC，取数据库时间）',
  attempts INT NOT NULL DEFAULT 0 COMMENT '已租用次数',
  created_at DATETIME(6) NOT NULL COMMENT '写入时间（与任务结束同事务，取数据库时间）',
  consumed_at DATETIME(6) NULL COMMENT '消费时间（UTC）',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_inbox_source (namespace_id, source_event_id, consumer),
  KEY ix_weave_inbox_scan (state, created_at, namespace_id, id),
  KEY ix_weave_inbox_lease (state, lease_expires_at, namespace_id, id),
  KEY ix_weave_inbox_task (namespace_id, task_id),
  KEY ix_weave_inbox_instance (namespace_id, instance_id, created_at),
  CONSTRAINT ck_weave_inbox_state CHECK (state IN ('PENDING', 'LEASED', 'CONSUMED', 'QUARANTINED')),
  CONSTRAINT ck_weave_inbox_task_state CHECK (task_state IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'NEEDS_REVIEW')),
  CONSTRAINT ck_weave_inbox_consumer CHECK (consumer IN ('ENGINE')),
  CONSTRAINT ck_weave_inbox_lease CHECK ((state = 'LEASED') = (lease_expires_at IS NOT NULL) AND (state = 'CONSUMED') = (consumed_at IS NOT NULL)),
  CONSTRAINT ck_weave_inbox_quarantine CHECK ((state = 'QUARANTINED') = (quarantine_reason IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='流程内部收件箱：流程拥有的任务结束时由唯一结束写入者同事务写入，按来源事件与消费者唯一';
