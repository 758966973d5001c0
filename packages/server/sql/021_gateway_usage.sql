-- What each gateway request used, per tenant: the tenant's spend limit and run quota count these
-- rows beside its runs (src/gateway/accounting.ts, src/runs/admission-counts.ts `spendFigures`).
CREATE TABLE IF NOT EXISTS gateway_usage (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant text NOT NULL,
  gateway text NOT NULL,
  status int NOT NULL,
  input_tokens bigint NOT NULL DEFAULT 0,
  output_tokens bigint NOT NULL DEFAULT 0,
  cost float8 NOT NULL DEFAULT 0,
  created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The period sums read one tenant's rows of the last hour, day or month.
CREATE INDEX IF NOT EXISTS gateway_usage_tenant_time ON gateway_usage (tenant, created_at);
