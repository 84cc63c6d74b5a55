-- Weave part 2: TIMER and SIGNAL waits, accepted signals, bounded POLL loops (issue 15).
-- depends: 0023_weave_engine
-- transactional: false

ALTER TABLE weave_pending_advances
  ADD COLUMN activation_id BINARY(16) NULL COMMENT '固定的激活 ID：TIMER、SIGNAL、POLL 检查点只推进创建时的这一激活（激活已结束即不推进）；ROOT 为空' AFTER step_id;

ALTER TABLE weave_pending_advances
  MODIFY COLUMN kind VARCHAR(16) NOT NULL COMMENT '类型：ROOT 根步骤续接（实例启动）；TIMER 计时等待到期；SIGNAL 信号等待超时检查；POLL 有界查询下一轮；RESUME 暂停后继续（后续）。同一步骤同一类型一行，下一轮时重新置为 PENDING';

CREATE TABLE IF NOT EXISTS weave_waits (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '等待 ID：128 位加密随机值',
  instance_id BINARY(16) NOT NULL COMMENT '流程实例 ID',
  step_id BINARY(16) NOT NULL COMMENT '等待所在的步骤 ID（TIMER 或 SIGNAL 步骤）',
  activation_id BINARY(16) NOT NULL COMMENT '等待所属的激活 ID：每个激活至多一个等待',
  kind VARCHAR(16) NOT NULL COMMENT '等待类型：TIMER 计时；SIGNAL 信号',
  generation INT NOT NULL DEFAULT 1 COMMENT '等待代次：人工重新布置时加一（第三部分），首个截止时间不变',
  signal_name VARCHAR(128) COLLATE utf8mb4_bin NULL COMMENT '等待的信号名称（SIGNAL）；TIMER 为空',
  correlation_key VARBINARY(764) NULL COMMENT '等待的关联键：按原始字节精确比较；新等待最多 512 字节；TIMER 为空',
  payload_versions VARCHAR(255) NULL COMMENT '接受的信号载荷版本（升序 JSON 整数数组，SIGNAL）；TIMER 为空',
  first_deadline_at DATETIME(6) NULL COMMENT '首个截止时间（UTC）：TIMER 的到期时间或 SIGNAL 的超时时间；重新布置时保留不变；SIGNAL 无超时为空',
  deadline_at DATETIME(6) NULL COMMENT '当前代次的截止时间（UTC）；SIGNAL 无超时为空',
  state VARCHAR(16) NOT NULL COMMENT '等待状态：WAITING 等待中；FIRED 计时已触发；SIGNALLED 已由赢家信号满足；TIMED_OUT 信号等待超时；CANCELLED 所在块或实例结束',
  winner_signal_id BINARY(16) NULL COMMENT '赢家信号 ID（SIGNALLED 时）：唯一索引保证一个信号至多赢得一个等待；一个等待只有这一列，故至多一个赢家',
  fired_at DATETIME(6) NULL COMMENT '满足时间（UTC，数据库时间）：计时触发、信号胜出或超时',
  late_ms BIGINT NULL COMMENT '触发相对截止时间的迟到毫秒数（TIMER 与超时；引擎停机期间到期的计时器迟到但照常记录）',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, id),
  UNIQUE KEY uq_weave_waits_activation (namespace_id, activation_id),
  UNIQUE KEY uq_weave_waits_winner (namespace_id, winner_signal_id),
  KEY ix_weave_waits_instance (namespace_id, instance_id, state),
  CONSTRAINT ck_weave_waits_kind CHECK (kind IN ('TIMER', 'SIGNAL')),
  CONSTRAINT ck_weave_waits_state CHECK (state IN ('WAITING', 'FIRED', 'SIGNALLED', 'TIMED_OUT', 'CANCELLED')),
  CONSTRAINT ck_weave_waits_winner CHECK ((state = 'SIGNALLED') = (winner_signal_id IS NOT NULL)),
  CONSTRAINT ck_weave_waits_signal CHECK ((kind = 'SIGNAL') = (signal_name IS NOT NULL AND correlation_key IS NOT NULL AND payload_versions IS NOT NULL)),
  CONSTRAINT ck_weave_waits_timer CHECK (kind = 'SIGNAL' OR (deadline_at IS NOT NULL AND first_deadline_at IS NOT NULL)),
  CONSTRAINT ck_weave_waits_generation CHECK (generation >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='流程等待：TIMER 与 SIGNAL 步骤激活的等待，保存身份、截止时间与唯一赢家';

CREATE TABLE IF NOT EXISTS weave_signals (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  id BINARY(16) NOT NULL COMMENT '信号 ID：128 位加密随机值',
  instance_id BINARY(16) NOT NULL COMMENT '目标流程实例 ID',
  name VARCHAR(128) COLLATE utf8mb4_bin NOT NULL COMMENT '信号名称：按原始字节比较',
  correlation_key VARBINARY(764) NOT NULL COMMENT '关联键：按原始字节精确比较；受理时最多 512 字节（存储兼容 764 字节）；未给出为空串',
  payload MEDIUMTEXT NOT NULL COMMENT '信号载荷 JSON',
  payload_version INT NOT NULL COMMENT '载荷版本：须在等待接受的版本之内',
  state VARCHAR(16) NOT NULL COMMENT '状态：PENDING 待消费（等待尚未出现时保留到过期）；LEASED 已被引擎租用；CONSUMED 已成为某等待的赢家；REJECTED 永远不能胜出，见 disposition',
  disposition VARCHAR(32) NULL COMMENT '处置（终态时写入）：consumed 胜出；payload_version 载荷版本不被接受；instance_finished 实例已结束；correlation_mismatch 关联键与打开的等待不符；wait_closed 同名等待已结束（已有赢家或已超时）；unknown_signal 定义中没有此名称的 SIGNAL 步骤；expired 过期仍未被消费',
  wait_id BINARY(16) NULL COMMENT '胜出的等待 ID（CONSUMED 时）',
  target_activation_sequence INT NULL COMMENT '胜出等待所属激活的序号（CONSUMED 时）',
  evidence_ref VARCHAR(512) NULL COMMENT '发送方提供的证据引用（如外部系统的回调编号），仅保存与展示',
  expires_at DATETIME(6) NOT NULL COMMENT '过期时间（UTC）：受理时确定，之后从不改变；过期仍未消费即以 expired 拒绝',
  available_at DATETIME(6) NOT NULL COMMENT '下次检查时间（UTC）：没有等待时按退避推后，不改变 expires_at',
  checks INT NOT NULL DEFAULT 0 COMMENT '已检查而未能处置的次数（决定退避）',
  lease_owner VARCHAR(128) NULL COMMENT '租用者（引擎副本标识）；未租用为空',
  lease_expires_at DATETIME(6) NULL COMMENT '租约到期时间（UTC，取数据库时间）',
  attempts INT NOT NULL DEFAULT 0 COMMENT '已租用次数',
  accepted_by_credential_id BINARY(16) NOT NULL COMMENT '发送信号的凭据 ID',
  accepted_at DATETIME(6) NOT NULL COMMENT '受理时间（UTC，取数据库时间）',
  resolved_at DATETIME(6) NULL COMMENT '消费或拒绝的时间（UTC）',
  PRIMARY KEY (namespace_id, id),
  KEY ix_weave_signals_history (namespace_id, instance_id, accepted_at, id),
  KEY ix_weave_signals_match (namespace_id, instance_id, name, state),
  KEY ix_weave_signals_scan (state, available_at, namespace_id, id),
  KEY ix_weave_signals_lease (state, lease_expires_at, namespace_id, id),
  CONSTRAINT ck_weave_signals_state CHECK (state IN ('PENDING', 'LEASED', 'CONSUMED', 'REJECTED')),
  CONSTRAINT ck_weave_signals_disposition CHECK ((state IN ('CONSUMED', 'REJECTED')) = (disposition IS NOT NULL) AND (state = 'CONSUMED') = (wait_id IS NOT NULL)),
  CONSTRAINT ck_weave_signals_lease CHECK ((state = 'LEASED') = (lease_expires_at IS NOT NULL)),
  CONSTRAINT ck_weave_signals_version CHECK (payload_version >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='流程信号：受理即持久保存（等待尚未出现也保留到过期），由引擎原子地匹配等待、推进并确认消费';

CREATE TABLE IF NOT EXISTS weave_poll_states (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  instance_id BINARY(16) NOT NULL COMMENT '流程实例 ID',
  step_id BINARY(16) NOT NULL COMMENT 'POLL 步骤 ID：每个步骤一行，跨激活保留',
  activation_id BINARY(16) NOT NULL COMMENT '当前激活 ID',
  state VARCHAR(16) NOT NULL COMMENT '状态：ROUND 本轮任务进行中；WAITING 等待下一轮时间；SATISFIED 条件成立；EXHAUSTED 轮次或截止用尽；FAILED 本轮任务失败；CANCELLED 所在块或实例结束',
  used_rounds INT NOT NULL DEFAULT 0 COMMENT '已使用的轮次（从首次激活起编号，重启、暂停继续与人工恢复都不重置）',
  max_rounds INT NOT NULL COMMENT '最多轮次（定义给出，启动时固定）',
  first_round INT NOT NULL DEFAULT 1 COMMENT '当前激活的首个业务轮序号',
  first_round_attempts_used INT NOT NULL DEFAULT 0 COMMENT '当前激活首个业务轮在旧激活已消耗的尝试数',
  next_interval_ms BIGINT NOT NULL COMMENT '下一次间隔毫秒数（固定或按退避增长，持久保存）',
  next_round_at DATETIME(6) NULL COMMENT '下一轮的时间（UTC）：WAITING 时有值',
  deadline_at DATETIME(6) NULL COMMENT '整个查询的绝对截止时间（UTC）：首次激活时确定，之后从不改变；未设为空',
  last_result MEDIUMTEXT NULL COMMENT '最近一次已处理轮次的任务结果 JSON（权威，用于条件与恢复）',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  updated_at DATETIME(6) NOT NULL COMMENT '最后修改时间（UTC，取数据库时间）',
  PRIMARY KEY (namespace_id, instance_id, step_id),
  CONSTRAINT ck_weave_poll_states_state CHECK (state IN ('ROUND', 'WAITING', 'SATISFIED', 'EXHAUSTED', 'FAILED', 'CANCELLED')),
  CONSTRAINT ck_weave_poll_states_rounds CHECK (used_rounds >= 0 AND max_rounds >= 1 AND used_rounds <= max_rounds AND first_round >= 1 AND first_round_attempts_used >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='有界查询状态：POLL 步骤的已用轮次、间隔与绝对截止，跨重启、暂停和恢复保留';

CREATE TABLE IF NOT EXISTS weave_poll_rounds (
  namespace_id BINARY(16) NOT NULL COMMENT '命名空间 ID',
  instance_id BINARY(16) NOT NULL COMMENT '流程实例 ID',
  activation_id BINARY(16) NOT NULL COMMENT 'POLL 步骤激活 ID',
  round INT NOT NULL COMMENT '轮次序号：从 1 起，与已用轮次一致',
  step_id BINARY(16) NOT NULL COMMENT 'POLL 步骤 ID',
  task_id BINARY(16) NOT NULL COMMENT '本轮创建的任务 ID',
  state VARCHAR(16) NOT NULL COMMENT '轮次状态：RUNNING 任务进行中；MET 条件成立；NOT_MET 条件不成立；FAILED 任务失败；CANCELLED 任务被取消或所在块结束',
  result MEDIUMTEXT NULL COMMENT '本轮任务结果 JSON（成功时）',
  created_at DATETIME(6) NOT NULL COMMENT '创建时间（UTC，取数据库时间）',
  ended_at DATETIME(6) NULL COMMENT '结束时间（UTC）',
  PRIMARY KEY (namespace_id, instance_id, activation_id, round),
  UNIQUE KEY uq_weave_poll_rounds_task (namespace_id, task_id),
  CONSTRAINT ck_weave_poll_rounds_state CHECK (state IN ('RUNNING', 'MET', 'NOT_MET', 'FAILED', 'CANCELLED')),
  CONSTRAINT ck_weave_poll_rounds_round CHECK (round >= 1)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='有界查询轮次：每轮一行（实例、激活、轮次唯一），带本轮任务与结果';
