-- Weave part 3: manual recovery of a step (issue 16) -- a step held for a human decision
-- (`$hold`, or a task in NEEDS_REVIEW), the error it would have propagated, the logical
-- conclusion an operator records for it, and the RESOLVE pending advance that carries that
-- conclusion to the engine.
-- depends: 0027_weave_stop_intent
-- transactional: false

ALTER TABLE weave_steps
  ADD COLUMN held_at DATETIME(6) NULL COMMENT '挂起时间（UTC，取数据库时间）：失败或超时的目标为 $hold 时步骤停在 WAITING、激活保持 LIVE，等待人工决定（重试、结论或重新等待）；未挂起为空，与 held_error 同时为空或同时非空' AFTER join_state;

ALTER TABLE weave_steps
  ADD COLUMN held_error TEXT NULL COMMENT '挂起时本应传播的错误 JSON（如 {"error":"task_failed",…}、{"error":"signal_timeout",…}、{"error":"poll_exhausted",…}）；与 held_at 同时为空或同时非空，人工处理后清空' AFTER held_at;

ALTER TABLE weave_steps
  ADD COLUMN resolution TEXT NULL COMMENT '人工记录的步骤逻辑结论 JSON（conclusion、output 或 error、reason、evidence_ref、actor、at）：与任务的执行核查结论分开保存；写入后由 RESOLVE 接续按此推进，之后保留不变' AFTER held_error;

ALTER TABLE weave_steps
  ADD CONSTRAINT ck_weave_steps_held CHECK ((held_at IS NULL) = (held_error IS NULL) AND (held_at IS NULL OR state = 'WAITING') AND (held_error IS NULL OR JSON_VALID(held_error)) AND (resolution IS NULL OR JSON_VALID(resolution)));

ALTER TABLE weave_pending_advances
  DROP CONSTRAINT ck_weave_advances_kind;

ALTER TABLE weave_pending_advances
  ADD CONSTRAINT ck_weave_advances_kind CHECK (kind IN ('ROOT', 'TIMER', 'SIGNAL', 'POLL', 'RESUME', 'RESOLVE'));

ALTER TABLE weave_pending_advances
  MODIFY COLUMN kind VARCHAR(16) NOT NULL COMMENT '类型：ROOT 根步骤续接（实例启动；用户取消时重新到期，引擎借它结清正在停止的实例）；TIMER 计时等待到期；SIGNAL 信号等待超时检查；POLL 有界查询下一轮；RESUME 继续检查点（每个实例一行，挂在 $root 步骤上：暂停时写为 PENDING 且 due_at = 9999-12-31，继续时 due_at 改为当时，引擎租到后按顺序重放挂起的检查点）；RESOLVE 人工结论（挂在被处理的步骤上：引擎读取步骤的 resolution，按成功或失败推进该步骤）。同一步骤同一类型一行，下一轮时重新置为 PENDING';

ALTER TABLE weave_steps
  MODIFY COLUMN kind VARCHAR(16) NOT NULL COMMENT '步骤类型：ROOT 内部根步骤；TASK、CHOICE、PARALLEL、SUCCEED、FAIL、TIMER、SIGNAL、POLL';
