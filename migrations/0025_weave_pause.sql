-- Weave part 3: pause and resume of a workflow instance -- the paused flag and control revision
-- on the instance (kept apart from its execution state), parked clock checkpoints, the count of
-- checkpoints a resume replays (issue 16).
-- depends: 0024_weave_waits
-- transactional: false

ALTER TABLE weave_instances
  ADD COLUMN paused TINYINT NOT NULL DEFAULT 0 COMMENT '暂停标记：1 表示已暂停（与实例执行状态 state 分开）；暂停期间门控关闭，引擎不推进，到达的结果与到期的检查点挂起等待继续' AFTER state;

ALTER TABLE weave_instances
  ADD COLUMN control_revision BIGINT NOT NULL DEFAULT 1 COMMENT '控制版本：每次暂停或继续条件更新加一，与实例门控的控制版本同事务更新；推进不改变它' AFTER paused;

ALTER TABLE weave_instances
  ADD COLUMN checkpoints INT NOT NULL DEFAULT 0 COMMENT '挂起的检查点数：暂停期间引擎挂起的收件行与到期待推进记录的数量；继续后重放时清零' AFTER control_revision;

ALTER TABLE weave_instances
  ADD CONSTRAINT ck_weave_instances_control CHECK (paused IN (0, 1) AND control_revision >= 1 AND checkpoints >= 0);

ALTER TABLE weave_pending_advances
  ADD COLUMN parked_due_at DATETIME(6) NULL COMMENT '挂起时保存的原到期时间（UTC）：实例暂停期间到期的记录 due_at 改为 9999-12-31（扫描不到），继续后按此顺序重放并清空；未挂起为空' AFTER due_at;

ALTER TABLE weave_pending_advances
  MODIFY COLUMN kind VARCHAR(16) NOT NULL COMMENT '类型：ROOT 根步骤续接（实例启动）；TIMER 计时等待到期；SIGNAL 信号等待超时检查；POLL 有界查询下一轮；RESUME 继续检查点（每个实例一行，挂在 $root 步骤上：暂停时写为 PENDING 且 due_at = 9999-12-31，继续时 due_at 改为当时，引擎租到后按顺序重放挂起的检查点）。同一步骤同一类型一行，下一轮时重新置为 PENDING';

ALTER TABLE weave_inbox
  MODIFY COLUMN outcome VARCHAR(32) NULL COMMENT '消费结局（CONSUMED 时写入）：advanced 已推进；held 步骤等待人工复核（不消费激活）；duplicate 同一事件已推进过；stale 激活已不是当前激活或任务不符（保留不推进）；closed_block 所在 PARALLEL 块已关闭（保留不推进）；instance_ended 实例已结束（保留不推进）；rejected 推进被确定性地拒绝，实例因此失败；paused 实例暂停时挂起（结果已记录、尚未推进，实例的 RESUME 检查点在继续后按顺序重放它并改写为最终结局）';
