// The setup of the question tests: a `concierge` agent with the runtime's askHuman, an ask tool
// without a `question` argument (`pick`) and a tool that needs approval (`book`), on a limiter
// of one slot; a provider stand-in that scripts the model; a server on a PostgreSQL database
// that can outlive it (for restarts).
import pg from 'pg';
import { askHuman, createAgent, createConcurrencyLimiter, tool } from 'sluice';
import type { SluiceConfig } from '@sluice/server';
import { startProviderStandIn, type ProviderStandIn, type StandInRequest } from '@sluice/testkit';
import {
  afterThisTest,
  freshDatabase,
  lastUserText,
  ownStandIn,
  standInModel,
  startTestServer,
  type TestServer,
} from '../helpers.js';

type Call = { id: string; name: string; arguments: Record<string, unknown> };

const city: Call = { id: 'call_q', name: 'ask_human', arguments: { question: 'Which city?' } };
const month: Call = { id: 'call_m', name: 'ask_human', arguments: { question: 'Which month?' } };
const pick: Call = { id: 'call_p', name: 'pick', arguments: { options: ['train', 'plane'] } };
const book: Call = { id: 'call_b', name: 'book', arguments: { nights: 2 } };

/** The calls of the model's first turn, by a word of the prompt. */
const scripts: Record<string, Call[]> = {
  ask: [city],
  two: [city, month],
  pick: [pick],
  mixed: [book, city],
};

/**
 * The model: a prompt naming a script makes its calls; with the results, it says what it was
 * told, in the order of its calls. Anything else is answered at once.
 */
export function conciergeReply(request: StandInRequest) {
  const results = request.messages.filter((m) => m.role === 'tool');
  if (results.length > 0) return { text: `told: ${results.map((m) => String(m.content)).join(' | ')}` };
  const last = lastUserText(request);
  const calls = Object.entries(scripts).find(([word]) => last.startsWith(word))?.[1];
  if (calls) return { text: 'One moment. ', toolCalls: calls };
  return { text: `done ${last}` };
}

/** What the `book` tool did, in order. */
export type ToolLog = string[];

export function conciergeAgents(provider: ProviderStandIn, log: ToolLog): SluiceConfig['agents'] {
  const model = standInModel(provider);
  const limiter = createConcurrencyLimiter({ maxConcurrent: 1 });
  const tools = [
    askHuman,
    tool({
      name: 'pick',
      description: 'the user picks one of the options',
      parameters: { type: 'object', properties: { options: { type: 'array', items: { type: 'string' } } } },
      ask: true,
    }),
    tool<{ nights: number }>({
      name: 'book',
      description: 'books a hotel',
      parameters: { type: 'object', properties: { nights: { type: 'number' } }, required: ['nights'] },
      needsApproval: true,
      execute: ({ nights }) => {
        log.push(`book ${nights}`);
        return `booked ${nights}`;
      },
    }),
  ];
  return {
    concierge: createAgent({ model, credentials: { apiKey: 'k' }, tools, concurrency: { limiter } }),
  };
}

export interface QuestionServer extends TestServer {
  /** Every request the model got, in order. */
  asked: StandInRequest[];
  log: ToolLog;
  resume(id: string, body: unknown, token?: string): ReturnType<TestServer['call']>;
}

/**
 * A server with the concierge agent (and `echo`) on a new PostgreSQL database, or on
 * `databaseUrl` (a restart test opens a second server on it), with its own stand-in unless
 * one is given. Closed after the test, or after the file when started in `beforeAll`.
 */
export async function startQuestionServer(
  options: {
    databaseUrl?: string;
    provider?: ProviderStandIn;
    asked?: StandInRequest[];
    log?: ToolLog;
    /** false: no queue workers (a run resumed here is claimed by another server on the database). */
    background?: boolean;
  } = {},
): Promise<QuestionServer> {
  const asked = options.asked ?? [];
  const log = options.log ?? [];
  const provider =
    options.provider ??
    ownStandIn(
      await startProviderStandIn({
        reply: (r) => {
          asked.push(r);
          return conciergeReply(r);
        },
      }),
    );
  const t = await startTestServer({
    provider,
    databaseUrl: options.databaseUrl ?? (await freshDatabase()),
    agents: () => conciergeAgents(provider, log),
    background: options.background,
  });
  return {
    ...t,
    asked,
    log,
    resume: (id, body, token) => t.call('POST', `/agents/runs/${id}/resume`, body, token),
  };
}

/**
 * Holds back the write of every pause's last event (`run.requires_action`) on the database at
 * `databaseUrl`, with a trigger that waits on an advisory lock this holds, until `release()`.
 * The executor writes that event just after the row says the run paused: this is the moment
 * between the two, made as long as a test needs. Undone after the test.
 */
export async function holdPauseEnds(databaseUrl: string): Promise<{ release(): Promise<void> }> {
  const key = 7411;
  const admin = new pg.Client({ connectionString: databaseUrl });
  await admin.connect();
  afterThisTest(() => admin.end());
  await admin.query(`CREATE FUNCTION held_pause_end() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.events -> -1 ->> 0 = 'run.requires_action' THEN PERFORM pg_advisory_xact_lock_shared(${key}); END IF;
      RETURN NEW;
    END $$`);
  await admin.query(`CREATE TRIGGER held_pause_end BEFORE INSERT ON agent_run_events
    FOR EACH ROW EXECUTE FUNCTION held_pause_end()`);
  afterThisTest(async () => void (await admin.query('DROP FUNCTION held_pause_end() CASCADE')));
  await admin.query('SELECT pg_advisory_lock($1)', [key]);
  return { release: async () => void (await admin.query('SELECT pg_advisory_unlock($1)', [key])) };
}
