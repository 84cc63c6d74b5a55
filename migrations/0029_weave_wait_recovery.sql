-- Weave part 3: re-arm a timed-out SIGNAL wait, continue an exhausted or cut-short POLL step
-- (issue 16; spec 000022). weave_poll_states already keeps first_round and
-- first_round_attempts_used (0024); a continue also grants rounds and may give a new query
-- deadline, both kept apart from the definition's max_rounds and the first deadline_at, which
-- never change.
-- depends: 0028_weave_step_recovery
-- transactional: false

ALTER TABLE weave_poll_states
  ADD COLUMN granted_rounds INT NOT NULL DEFAULT 0 COMMENT '人工继续追加的轮次总数（每次继续至少 1）：可用轮次为 max_rounds + granted_rounds；max_rounds 保持定义给出的值' AFTER max_rounds;

ALTER TABLE weave_poll_states
  ADD COLUMN continued_deadline_at DATETIME(6) NULL COMMENT '人工继续给出的新查询截止时间（UTC）：非空时代替 deadline_at 作为生效的查询截止；deadline_at（首次激活确定）从不改变；未给出为空' AFTER deadline_at;

ALTER TABLE weave_poll_states
  DROP CONSTRAINT ck_weave_poll_states_rounds;

ALTER TABLE weave_poll_states
  ADD CONSTRAINT ck_weave_poll_states_rounds CHECK (used_rounds >= 0 AND max_rounds >= 1 AND granted_rounds >= 0 AND used_rounds <= max_rounds + granted_rounds AND first_round >= 1 AND first_round_attempts_used >= 0);
