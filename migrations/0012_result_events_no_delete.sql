-- Platform: result events refuse DELETE like every other append-only table.
-- depends: 0011_application_usage_tracking
-- transactional: false

-- 0008 added only the BEFORE UPDATE trigger: a DELETE could remove a result event and leave a
-- gap in the namespace's gap-free sequence that subscriptions rely on.
CREATE TRIGGER trg_orbit_result_events_no_delete BEFORE DELETE ON orbit_result_events FOR EACH ROW
  SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'orbit_result_events is append-only';
