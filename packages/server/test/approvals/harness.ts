// The setup of the approval tests: a `bank` agent whose `transfer` tool needs approval (and a
// `lookup` tool that does not) on a limiter of one slot, a provider stand-in that scripts the
// model, and a server on a database that can outlive it (for restarts).
import { createAgent, createConcurrencyLimiter, tool } from 'sluice';
import type { RunningServer, SluiceConfig } from '@sluice/server';
import { startProviderStandIn, type ProviderStandIn, type StandInRequest } from '@sluice/testkit';
import { lastUserText, standInModel, startTestServer, type Body, type Reply } from '../helpers.js';

/** The model: "pay N" calls transfer(N) and lookup; with the results, it says what it was told. */
export function bankReply(request: StandInRequest) {
  const results = request.messages.filter((m) => m.role === 'tool');
  const last = lastUserText(request);
  if (results.length > 0) {
    const told = Object.fromEntries(results.map((m) => [m.tool_call_id, String(m.content)]));
    return { text: `told: ${told.call_t} | ${told.call_l}` };
  }
  if (last.includes('stall')) return { stall: true as const };
  const pay = /pay (\d+)/.exec(last);
  if (pay)
    return {
      text: 'Checking. ',
      toolCalls: [
        { id: 'call_t', name: 'transfer', arguments: { amount: Number(pay[1]) } },
        { id: 'call_l', name: 'lookup', arguments: {} },
      ],
    };
  return { text: `done ${last}` };
}

/** What the tools did, in order. */
export type ToolLog = string[];

export function bankAgents(provider: ProviderStandIn, log: ToolLog): SluiceConfig['agents'] {
  const model = standInModel(provider);
  const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
  const tools = [
    tool<{ amount: number }>({
      name: 'transfer',
      description: 'moves money',
      parameters: { type: 'object', properties: { amount: { type: 'number' } }, required: ['amount'] },
      needsApproval: true,
      execute: ({ amount }) => {
        log.push(`transfer ${amount}`);
        return `sent ${amount}`;
      },
    }),
    tool({
      name: 'lookup',
      description: 'reads the balance',
      parameters: { type: 'object', properties: {} },
      execute: () => {
        log.push('lookup');
        return 'balance 900';
      },
    }),
  ];
  return {
    bank: createAgent({ model, credentials: { apiKey: 'k' }, tools, concurrency: { limiter } }),
    // No limiter: what fills the tenant's cap without touching the bank's slot.
    echo: createAgent({ model, credentials: { apiKey: 'k' } }),
  };
}

export interface ApprovalServer {
  server: RunningServer;
  token(who?: Partial<{ tenant: string; project: string; role: 'admin' | 'member' }>): Promise<string>;
  call(method: string, path: string, body?: unknown, token?: string): Promise<Reply>;
  close(): Promise<void>;
}

/**
 * A server with the bank agents. On `databaseUrl` when given (a restart test opens a second
 * server on it), else on a copy of the PGlite template. Closed after the test, or by `close`.
 */
export async function startApprovalServer(options: {
  provider: ProviderStandIn;
  log: ToolLog;
  databaseUrl?: string;
  tenants?: SluiceConfig['tenants'];
}): Promise<ApprovalServer> {
  const { server, token, call } = await startTestServer({
    provider: options.provider,
    agents: () => bankAgents(options.provider, options.log),
    echo: false,
    databaseUrl: options.databaseUrl,
    tenants: options.tenants,
  });
  return { server, token, call, close: () => server.close() };
}

export async function bankProvider(): Promise<ProviderStandIn> {
  return startProviderStandIn({ reply: bankReply });
}

/** The approvals that answer every pending call of a paused run the same way. */
export const answerAll = (run: Body, approved: boolean, reason?: string) =>
  (run.required_action.tool_calls as { id: string }[]).map((c) => ({
    tool_call_id: c.id,
    approved,
    ...(reason === undefined ? {} : { reason }),
  }));
