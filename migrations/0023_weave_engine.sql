-- Weave: the engine's bookkeeping — why each consumed inbox row did or did not advance its
-- instance, and the branch outcomes a running PARALLEL block has collected so far (issue 14).
-- depends: 0022_weave
-- transactional: false

ALTER TABLE weave_inbox
  ADD COLUMN outcome VARCHAR(32) NULL COMMENT '消费结局（CONSUMED 时写入）：advanced 已推进；held 步骤等待人工复核（不消费激活）；duplicate 同一事件已推进过；stale 激活已不是当前激活或任务不符（保留不推进）；closed_block 所在 PARALLEL 块已关闭（保留不推进）；instance_ended 实例已结束（保留不推进）；rejected 推进被确定性地拒绝，实例因此失败' AFTER consumed_at;

ALTER TABLE weave_steps
  ADD COLUMN join_state MEDIUMTEXT NULL COMMENT 'PARALLEL 步骤运行中已到达汇合的分支结局 JSON（{分支名: {"ok": 布尔, "value": 值}}）；块结束后保留用于排查；其他步骤为空' AFTER error;
