-- Pulse: a worker instance belongs to the credential that registered it (issue 11 §4); the
-- column keeps its type and now names the current owner, which changes only when the owner is
-- revoked and another credential of the application registers the instance.
-- depends: 0018_task_budget_and_workflow_gate
-- transactional: false

ALTER TABLE pulse_worker_instances
  MODIFY COLUMN credential_id BINARY(16) NOT NULL COMMENT '所属凭据 ID：只有该凭据能为实例注册会话（隔离旧会话、接管在途尝试）；该凭据被吊销后，由同应用下一个注册该实例的凭据接管';
