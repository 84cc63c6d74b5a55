-- Pulse: dispatcher heartbeats and the database outages compensated from their gaps.
-- depends: 0015_task_owner
-- transactional: false

-- Every dispatcher writes its row each second in database time. The newest beat_at over all
-- rows is the fleet's last sign of life: a gap in it longer than the threshold is an outage
-- (nobody could reach the database, so no worker could renew), compensated once per gap.
CREATE TABLE pulse_dispatch_heartbeats (
  node VARCHAR(191) NOT NULL COMMENT '调度器实例标识（配置的 node，缺省为 主机名:进程号）',
  beat_at DATETIME(6) NOT NULL COMMENT '该实例最近一次心跳的数据库时间（UTC）',
  started_at DATETIME(6) NOT NULL COMMENT '该实例首次写入心跳的数据库时间（UTC）',
  PRIMARY KEY (node),
  KEY ix_dispatch_heartbeats_beat (beat_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='调度器心跳：各调度器每秒以数据库时间更新；全体心跳中断超过阈值即视为数据库不可达（中断），用于补偿租约';

-- One row per compensated gap; the primary key (the last beat before the gap) makes the
-- compensation happen exactly once however many dispatchers notice the gap.
CREATE TABLE pulse_dispatch_outages (
  gap_started_at DATETIME(6) NOT NULL COMMENT '中断前全体调度器的最后一次心跳时间（UTC），即中断起点；主键保证每次中断只补偿一次',
  gap_ended_at DATETIME(6) NOT NULL COMMENT '发现中断并完成补偿的数据库时间（UTC），即中断终点',
  gap_us BIGINT NOT NULL COMMENT '中断时长（微秒）：所有在中断起点仍有效的租约均顺延此时长',
  detected_by VARCHAR(191) NOT NULL COMMENT '发现并补偿此次中断的调度器实例标识',
  tasks_extended INT NOT NULL COMMENT '顺延了租约的任务数（LEASED 与 RUNNING，含其当前尝试）',
  sessions_extended INT NOT NULL COMMENT '顺延了有效期的工作者会话数',
  PRIMARY KEY (gap_started_at),
  CONSTRAINT ck_dispatch_outages_gap CHECK (gap_us > 0 AND gap_ended_at > gap_started_at),
  CONSTRAINT ck_dispatch_outages_counts CHECK (tasks_extended >= 0 AND sessions_extended >= 0)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci
  COMMENT='数据库中断补偿记录：每次心跳中断一行，记录中断区间与顺延的租约数；中断期间无人能续约，因此不得使租约过期';
