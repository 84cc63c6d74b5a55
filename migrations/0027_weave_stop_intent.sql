-- Weave: the stop intent of a workflow instance (issue 16, part 1; specification 001 000021):
-- the frozen first stop target (a user's cancel or a failure settlement) and when it was
-- recorded, the user's explicit cancel apart from it, the STOPPED state of an instance's gate,
-- the inbox outcome ``stopping``.
-- depends: 0026_weave_instance_list_indexes
-- transactional: false

ALTER TABLE weave_instances
  ADD COLUMN stop_kind VARCHAR(16) NULL COMMENT '停止意图类型（首次记录后冻结）：CANCEL 用户取消；FAILURE 失败结清（步骤失败结束实例而仍有在途步骤）；为空表示没有停止意图' AFTER checkpoints;

ALTER TABLE weave_instances
  ADD COLUMN stop_requested_at DATETIME(6) NULL COMMENT '停止意图记录时间（UTC，数据库时间）：与 stop_kind 同时为空或同时非空，首次记录后冻结；此后不再创建新步骤' AFTER stop_kind;

ALTER TABLE weave_instances
  ADD COLUMN cancel_requested_at DATETIME(6) NULL COMMENT '用户显式取消时间（UTC，数据库时间）：只表示用户的取消请求；实例已因失败结清而停止时再取消只写本列，不改变 stop_kind' AFTER stop_requested_at;

ALTER TABLE weave_instances
  ADD CONSTRAINT ck_weave_instances_stop CHECK ((stop_kind IS NULL) = (stop_requested_at IS NULL) AND (stop_kind IS NULL OR stop_kind IN ('CANCEL', 'FAILURE')) AND (cancel_requested_at IS NULL OR stop_kind IS NOT NULL) AND (state <> 'STOPPING' OR stop_kind IS NOT NULL));

ALTER TABLE weave_instances
  MODIFY COLUMN state VARCHAR(16) NOT NULL COMMENT '实例状态（流程自有，不与任务状态混用）：RUNNING 运行中；STOPPING 已记录停止意图（用户取消或失败结清），门控已关闭，等待在途步骤（运行中的 TASK 步骤或 POLL 轮次任务）结束后结清；SUCCEEDED 成功；FAILED 失败；CANCELLED 已取消；PAUSED 保留未用（暂停见 paused 列）';

ALTER TABLE pulse_execution_gates
  DROP CONSTRAINT ck_gates_state;

ALTER TABLE pulse_execution_gates
  ADD CONSTRAINT ck_gates_state CHECK (state IN ('OPEN', 'PAUSED', 'STOPPED'));

ALTER TABLE pulse_execution_gates
  MODIFY COLUMN state VARCHAR(16) NOT NULL COMMENT '门控状态：OPEN 允许新的授权与开始；PAUSED 暂停新的授权与开始，在途结果照常记录；STOPPED 流程实例已停止（取消或失败结清），永久关闭，继续操作不能重新打开';

ALTER TABLE weave_inbox
  MODIFY COLUMN outcome VARCHAR(32) NULL COMMENT '消费结局（CONSUMED 时写入）：advanced 已推进；held 步骤等待人工复核（不消费激活）；duplicate 同一事件已推进过；stale 激活已不是当前激活、任务不符或步骤已有人工记录的结论（保留不推进）；closed_block 所在 PARALLEL 块已关闭（保留不推进）；instance_ended 实例已结束（保留不推进）；rejected 推进被确定性地拒绝，实例因此失败；paused 实例暂停时挂起（结果已记录、尚未推进，实例的 RESUME 检查点在继续后按顺序重放它并改写为最终结局）；stopping 实例停止中：结果记录到其步骤（已提交的成功保持成功），不推进，最后一个在途步骤的结果使实例结清';

ALTER TABLE pulse_execution_gates
  MODIFY COLUMN owner_kind VARCHAR(16) NOT NULL COMMENT '门控所属对象类型：QUEUE 队列；WORKFLOW 流程实例（暂停、继续与停止作用于它）';
