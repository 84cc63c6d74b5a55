-- 流程实例列表的组合过滤索引（issue 16 第 4 部分：历史）。
-- depends: 0025_weave_pause
-- transactional: false

-- 按定义与版本列出实例（最新在前）：版本号只在定义内有意义，所以只与定义一起使用。
ALTER TABLE weave_instances
  ADD KEY ix_weave_instances_version (namespace_id, definition_id, version, created_at, id) COMMENT '实例列表：按定义与版本过滤，按创建时间倒序读取';

-- 按定义与状态列出实例（如某个定义下 FAILED 的实例），不必在定义的全部实例中逐行筛选状态。
ALTER TABLE weave_instances
  ADD KEY ix_weave_instances_definition_state (namespace_id, definition_id, state, created_at, id) COMMENT '实例列表：按定义与状态过滤，按创建时间倒序读取';
