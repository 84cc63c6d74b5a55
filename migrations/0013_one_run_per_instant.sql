-- Pulse: at most one run per schedule instant is a database fact.
-- depends: 0012_result_events_no_delete
-- transactional: false

-- uq_occurrences_fire includes the source, so a RULE run and a BACKFILL or TRIGGER run of the
-- same instant were kept apart only by application code. run_fire_at is fire_at for a row that
-- ran (FIRED, MERGED) and NULL for a SKIPPED one; NULLs never collide in a unique index, so a
-- skipped RULE row and the BACKFILL run of that instant still coexist, two runs cannot.
ALTER TABLE pulse_schedule_occurrences
  ADD COLUMN run_fire_at DATETIME(6) AS (CASE WHEN outcome = 'SKIPPED' THEN NULL ELSE fire_at END) STORED COMMENT '运行的计划触发时间（生成列）：FIRED 与 MERGED 等于 fire_at，SKIPPED 为空；唯一索引据此保证每个（计划, UTC 计划时间）至多一次运行，不论来源' AFTER fire_at;

ALTER TABLE pulse_schedule_occurrences
  ADD UNIQUE KEY uq_occurrences_run (namespace_id, schedule_id, run_fire_at);

ALTER TABLE pulse_schedule_occurrences
  COMMENT='计划触发台账：每个（计划, UTC 计划时间, 来源）一行，每个（计划, UTC 计划时间）至多一行运行（FIRED 或 MERGED，由 uq_occurrences_run 保证）；与生成的任务和计划进度同事务写入，只追加；显式补跑另记一行';
