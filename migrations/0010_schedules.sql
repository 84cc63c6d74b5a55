-- Pulse: recurring schedules, their immutable versions and the occurrence ledger.
-- depends: 0009_flow_control
-- transactional: false

CREATE TABLE pulse_schedules (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '计划 ID：128 位加密随机值',
  queue_id BINARY(16) NOT NULL COMMENT '生成任务所进入的队列 ID；归属由服务层事务校验，无外键',
  name VARCHAR(128) COLLATE utf8mb4_bin NOT NULL COMMENT '计划名称：命名空间内唯一，按原始字节比较',
  state VARCHAR(16) NOT NULL COMMENT '状态：ACTIVE 按规则触发；PAUSED 暂停触发（恢复后按补跑策略处理积压）；DISABLED 停用（删除即停用，历史保留）',
  revision BIGINT NOT NULL DEFAULT 1 COMMENT '配置版本：发布新版本、暂停、恢复、停用时条件更新加一；触发进度变化不改变它',
  current_version INT NOT NULL COMMENT '最新发布的规则版本号（pulse_schedule_versions.version）',
  processing_version INT NOT NULL COMMENT '正在处理积压的版本号：覆盖到 covered_until 为止的触发时间由它决定，旧版本积压不被新版本改写',
  covered_until DATETIME(6) NOT NULL COMMENT '已处理范围的排除上界（UTC）：早于此时间的计划触发时间都已写入台账（触发、跳过或合并）',
  next_fire_at DATETIME(6) NULL COMMENT '下一个计划触发时间（UTC，未加抖动）；规则结束后为空',
  check_at DATETIME(6) NULL COMMENT '调度器下次检查时间（UTC）：到期后由任一调度器副本以 SKIP LOCKED 领取；停用或规则结束为空',
  buffered_fire_at DATETIME(6) NULL COMMENT '重叠策略 BUFFER_ONE 缓冲的一次触发（UTC 计划时间）；上一次任务结束后触发，为空表示无缓冲',
  last_task_id BINARY(16) NULL COMMENT '最近一次触发生成的任务 ID（重叠策略据此判断上一次是否结束）',
  last_fired_at DATETIME(6) NULL COMMENT '最近一次实际触发的数据库时间（UTC）',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  disabled_at DATETIME(6) NULL COMMENT '停用时间（UTC）；未停用为空',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_schedules_name (namespace_id, name),
  KEY ix_schedules_check (state, check_at),
  KEY ix_schedules_queue (namespace_id, queue_id, name),
  CONSTRAINT ck_schedules_state CHECK (state IN ('ACTIVE', 'PAUSED', 'DISABLED')),
  CONSTRAINT ck_schedules_revision CHECK (revision >= 1),
  CONSTRAINT ck_schedules_versions CHECK (current_version >= 1 AND processing_version BETWEEN 1 AND current_version),
  CONSTRAINT ck_schedules_disabled CHECK ((state = 'DISABLED') = (disabled_at IS NOT NULL))
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='计划：按时间规则重复生成任务；规则与模板在不可变版本中，进度在本行';

CREATE TABLE pulse_schedule_versions (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  schedule_id BINARY(16) NOT NULL COMMENT '所属计划 ID',
  version INT NOT NULL COMMENT '版本号：从 1 开始连续递增，发布时在计划行条件更新下分配',
  rule MEDIUMTEXT NOT NULL COMMENT '时间规则 JSON（冻结）：cron 或固定间隔、IANA 时区、CalendarVersion（时区库版本）、起止边界、夏令时策略、抖动',
  template MEDIUMTEXT NOT NULL COMMENT '任务模板 JSON（冻结）：处理器、原样保存的输入文本、优先级、重试、截止、效果安全、资源键',
  misfire_policy VARCHAR(16) NOT NULL COMMENT '错过触发的处理：SKIP 跳过并记录范围；MERGE 合并为一次运行并记录覆盖范围；EACH 补跑窗口内的每一次',
  overlap_policy VARCHAR(16) NOT NULL COMMENT '上一次未结束时：ALLOW 照常触发；SKIP 跳过；BUFFER_ONE 缓冲一次，上一次结束后触发',
  catchup_window_ms BIGINT NOT NULL COMMENT '补跑窗口（毫秒）：早于 当前时间 − 窗口 的错过触发一律跳过并记录',
  grace_ms BIGINT NOT NULL COMMENT '宽限（毫秒）：晚于计划时间不超过宽限的触发视为准时，不按错过处理',
  effective_from DATETIME(6) NOT NULL COMMENT '生效时间（UTC，发布时的数据库时间）：计划时间不早于此且早于下一版本生效时间的触发由本版本决定',
  created_by VARCHAR(255) NOT NULL COMMENT '发布者（凭据 ID 或操作员）',
  created_at DATETIME(6) NOT NULL COMMENT '发布时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, schedule_id, version),
  CONSTRAINT ck_schedule_versions_version CHECK (version >= 1),
  CONSTRAINT ck_schedule_versions_rule_json CHECK (JSON_VALID(rule)),
  CONSTRAINT ck_schedule_versions_template_json CHECK (JSON_VALID(template)),
  CONSTRAINT ck_schedule_versions_misfire CHECK (misfire_policy IN ('SKIP', 'MERGE', 'EACH')),
  CONSTRAINT ck_schedule_versions_overlap CHECK (overlap_policy IN ('ALLOW', 'SKIP', 'BUFFER_ONE')),
  CONSTRAINT ck_schedule_versions_windows CHECK (catchup_window_ms >= 0 AND grace_ms >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='计划版本：不可变的规则与模板历史，只追加';

CREATE TABLE pulse_schedule_occurrences (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '台账记录 ID：128 位加密随机值',
  schedule_id BINARY(16) NOT NULL COMMENT '所属计划 ID',
  fire_at DATETIME(6) NOT NULL COMMENT '计划触发时间（UTC，未加抖动）：同一计划同一来源唯一',
  version INT NOT NULL COMMENT '决定这次触发的计划版本号',
  source VARCHAR(16) NOT NULL COMMENT '来源：RULE 规则触发；BACKFILL 显式补跑；TRIGGER 立即触发',
  outcome VARCHAR(16) NOT NULL COMMENT '结果：FIRED 已生成任务；SKIPPED 跳过（原因见 reason）；MERGED 合并为一次运行',
  reason VARCHAR(64) NULL COMMENT '跳过或合并的原因代码，如 misfire、outside_catchup_window、overlap、paused',
  covered_until DATETIME(6) NULL COMMENT '跳过或合并所覆盖范围的排除上界（UTC）；范围为 [fire_at, covered_until)，单次记录为空',
  covered_count INT NOT NULL DEFAULT 1 COMMENT '本记录覆盖的计划触发次数（合并或跳过范围内的次数）',
  task_id BINARY(16) NULL COMMENT '生成的任务 ID：FIRED 与 MERGED 非空，与任务同事务写入',
  fired_at DATETIME(6) NOT NULL COMMENT '写入台账的数据库时间（UTC）',
  lateness_ms BIGINT NOT NULL COMMENT '迟到毫秒数：fired_at 减（计划时间加抖动），不早于 0',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_occurrences_fire (namespace_id, schedule_id, fire_at, source),
  UNIQUE KEY uq_occurrences_task (namespace_id, task_id),
  CONSTRAINT ck_occurrences_source CHECK (source IN ('RULE', 'BACKFILL', 'TRIGGER')),
  CONSTRAINT ck_occurrences_outcome CHECK (outcome IN ('FIRED', 'SKIPPED', 'MERGED')),
  CONSTRAINT ck_occurrences_task CHECK ((outcome = 'SKIPPED') = (task_id IS NULL)),
  CONSTRAINT ck_occurrences_range CHECK (covered_until IS NULL OR covered_until > fire_at),
  CONSTRAINT ck_occurrences_count CHECK (covered_count >= 1 AND lateness_ms >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='计划触发台账：每个（计划, UTC 计划时间, 来源）一行，与生成的任务和计划进度同事务写入，只追加；显式补跑另记一行';

CREATE TRIGGER trg_pulse_schedule_versions_no_update BEFORE UPDATE ON pulse_schedule_versions FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'pulse_schedule_versions is append-only';

CREATE TRIGGER trg_pulse_schedule_versions_no_delete BEFORE DELETE ON pulse_schedule_versions FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'pulse_schedule_versions is append-only';

CREATE TRIGGER trg_pulse_schedule_occurrences_no_update BEFORE UPDATE ON pulse_schedule_occurrences FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'pulse_schedule_occurrences is append-only';

CREATE TRIGGER trg_pulse_schedule_occurrences_no_delete BEFORE DELETE ON pulse_schedule_occurrences FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'pulse_schedule_occurrences is append-only';
