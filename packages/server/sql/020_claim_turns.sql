-- Default-class claims go round-robin by tenant: the tenant whose last claim is oldest is served
-- next (one never served goes first), and within a tenant the oldest run. A turn is a number
-- from one sequence, so claims in the same microsecond are still ordered.
CREATE SEQUENCE IF NOT EXISTS claim_turn_seq;
CREATE TABLE IF NOT EXISTS claim_turns (
  class  text   NOT NULL,
  tenant text   NOT NULL,
  turn   bigint NOT NULL,
  PRIMARY KEY (class, tenant)
);

-- The tenants with queued default-class runs, each with its oldest, are read off this index one
-- tenant at a time (a skip scan): a claim costs one probe per waiting tenant, however long any
-- tenant's queue is.
CREATE INDEX IF NOT EXISTS agent_runs_queue_default_tenant ON agent_runs (tenant, seq)
  WHERE status = 'queued' AND class = 'default';
