import type { Database } from '@sluice/postgres/database';
import type { Agent } from 'sluice';
import type { RunningServer, ServerApp, ServerSettings, SluiceConfig } from '@sluice/server';
import type { ProviderStandIn } from '@sluice/testkit';
import { standInModel as pricedModel, startTestServer, type Reply, type Who } from '../helpers.js';

/**
 * What the limits tests need beyond the shared harness: their agents priced at $1 per million
 * tokens each way (so spend limits are reached in a few runs), member tokens by default, the
 * token before the body in `call`, and a store whose statements they can count.
 */

const price = { input: 1, output: 1 };

/** The model of every agent here: the stand-in, priced at $1 per million tokens each way. */
export const standInModel = (provider: ProviderStandIn) => pricedModel(provider, price);

/** Requests to a server's API, as the token given. */
export type LimitsCall = (method: string, path: string, token: string, body?: unknown) => Promise<Reply>;

export interface AgentServer {
  server: RunningServer;
  provider: ProviderStandIn;
  token(who?: Who): Promise<string>;
  call: LimitsCall;
}

/** A server on embedded PGlite with the agents given (built on the stand-in's model), closed after the test. */
export async function startAgentServer(options: {
  agents: (model: ReturnType<typeof standInModel>) => Record<string, Agent<string> | Agent<never>>;
  provider?: ProviderStandIn;
  tenants?: SluiceConfig['tenants'];
  settings?: Partial<ServerSettings>;
}): Promise<AgentServer> {
  const t = await startTestServer({ ...options, echo: false, price });
  return {
    server: t.server,
    provider: t.provider,
    token: (who = {}) => t.token({ role: 'member', ...who }),
    call: (method, path, token, body) => t.call(method, path, body, token),
  };
}

/** Statements a database handle was asked to run, counted as they start. */
export interface QueryCounts {
  queries: number;
  transactions: number;
  /** Sees each `query` (not those inside transactions) as it starts. */
  onQuery?: (text: string, params: unknown[] | undefined) => void;
}

/** The same database, counting every `query` and `transaction` that goes through it. */
export function countingDatabase(db: Database, counts: QueryCounts): Database {
  return {
    query: (text, params) => {
      counts.queries++;
      counts.onQuery?.(text, params);
      return db.query(text, params);
    },
    transaction: (body, options) => {
      counts.transactions++;
      return db.transaction(body, options);
    },
    ...(db.listen ? { listen: db.listen.bind(db) } : {}),
  };
}

/**
 * A server whose every statement is counted (the tokens are minted beside the count), listening
 * on a free port and started; closed after the test.
 */
export async function startCountedApp(settings: Partial<ServerSettings>): Promise<{
  app: ServerApp;
  url: string;
  counts: QueryCounts;
  provider: ProviderStandIn;
  token(who?: Who): Promise<string>;
  call: LimitsCall;
}> {
  const counts: QueryCounts = { queries: 0, transactions: 0 };
  const t = await startTestServer({
    settings,
    price,
    wrapStore: (store) => ({ ...store, db: countingDatabase(store.db, counts) }),
  });
  return {
    app: t.server,
    url: t.server.url,
    counts,
    provider: t.provider,
    token: (who = {}) => t.token({ role: 'member', ...who }),
    call: (method, path, token, body) => t.call(method, path, body, token),
  };
}
