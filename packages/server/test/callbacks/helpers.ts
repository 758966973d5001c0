import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import pg from 'pg';
import { toDatabase, type Database } from '@sluice/postgres/database';
import { ManualClock } from 'sluice/concurrency';
import { migrate } from '../../src/store/store.js';
import {
  CallbackDispatcher,
  type CallbackDispatcherOptions,
  type DispatcherEvent,
} from '../../src/callbacks/index.js';
import { afterThisFile, afterThisTest, postgres } from '../harness/index.js';

export { afterThisTest, deferred, postgres } from '../harness/index.js';

let shared: Promise<{ db: Database; pool: pg.Pool; schema: string }> | undefined;

async function admin(sql: string): Promise<void> {
  const client = new pg.Client({ ...postgres });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

/**
 * This test file's schema, with the server's migrations, on a small pool whose connections
 * use it; emptied before each test that asks for it, so a dispatcher sees only the rows its
 * test made. One schema per file, not per test: the PostgreSQL server is shared with other
 * suites, and connections and DDL are what it runs short of.
 */
export async function openDatabase(): Promise<{ db: Database; pool: pg.Pool; schema: string }> {
  if (!postgres) throw new Error('PostgreSQL is not available');
  shared ??= (async () => {
    const schema = `callbacks_${process.pid}_${Date.now().toString(36)}`;
    await admin(`CREATE SCHEMA ${schema}`);
    // Closed after this file: a worker may run another file after it (vitest's isolate: false),
    // which opens its own.
    afterThisFile(async () => {
      const opened = shared;
      shared = undefined;
      const { pool } = (await opened) ?? {};
      await pool?.end();
      await admin(`DROP SCHEMA ${schema} CASCADE`);
    }, 'the callbacks schema');
    const pool = new pg.Pool({ ...postgres, max: 4, options: `-c search_path=${schema}` });
    const db = toDatabase(pool);
    await migrate(db);
    return { db, pool, schema };
  })();
  const database = await shared;
  // CASCADE: later tables (trigger deliveries and ticks) point at runs; the counters go with the runs.
  await database.db.query(
    'TRUNCATE agent_runs, callback_deliveries, tenant_secrets, admission_counters CASCADE',
  );
  return database;
}

let runs = 0;

/** Inserts an agent_runs row in `status` and returns its id. */
export async function insertRun(
  db: Database,
  run: { status: string; callbackUrl?: string | null; tenant?: string },
): Promise<string> {
  const id = `run_test_${process.pid}_${runs++}`;
  await db.query(
    `INSERT INTO agent_runs (id, tenant, project, user_id, agent, mode, status, input, callback_url)
     VALUES ($1::text, $2::text, 'p', 'u', 'echo', 'queued', $3::text, '"hi"'::jsonb, $4::text)`,
    [id, run.tenant ?? 't', run.status, run.callbackUrl ?? null],
  );
  return id;
}

/** Ends a run as the server's statements do: status, error, finished_at in one UPDATE. */
export async function endRun(
  db: Database,
  id: string,
  status: 'succeeded' | 'failed' | 'canceled',
  errorType?: string,
): Promise<void> {
  await db.query(
    `UPDATE agent_runs SET status = $2::text, finished_at = clock_timestamp(),
       error = CASE WHEN $3::text IS NULL THEN NULL ELSE jsonb_build_object('type', $3::text, 'message', 'x') END
     WHERE id = $1::text`,
    [id, status, errorType ?? null],
  );
}

export interface ReceivedRequest {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  body: string;
}

export interface Receiver {
  url: string;
  port: number;
  /** Every request that reached the receiver, in arrival order (body read in full). */
  readonly requests: ReceivedRequest[];
  /** Requests whose response has not been sent yet. */
  readonly open: number;
  /** The most requests ever open at once. */
  readonly maxOpen: number;
  /** Resolves once `requests.length >= n`. */
  received(n: number): Promise<void>;
  /** Resolves once `open >= n`. */
  opened(n: number): Promise<void>;
}

/**
 * An HTTP receiver on 127.0.0.1. `answer` decides each response; it may return a promise to
 * hold the request open until the test settles it.
 */
export async function startReceiver(
  answer: (request: ReceivedRequest, response: ServerResponse) => void | Promise<void>,
): Promise<Receiver> {
  const requests: ReceivedRequest[] = [];
  const waiters: { ready: () => boolean; resolve: () => void }[] = [];
  const wake = () => {
    for (const w of [...waiters]) {
      if (w.ready()) {
        waiters.splice(waiters.indexOf(w), 1);
        w.resolve();
      }
    }
  };
  let open = 0;
  let maxOpen = 0;
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const request = {
        method: req.method!,
        url: req.url!,
        headers: req.headers,
        body: Buffer.concat(chunks).toString('utf8'),
      };
      requests.push(request);
      open++;
      maxOpen = Math.max(maxOpen, open);
      let closed = false;
      const close = () => {
        if (closed) return;
        closed = true;
        open--;
        wake();
      };
      res.on('close', close);
      wake();
      // A request stops counting as open when the receiver decides to answer, before the
      // client can see the answer: so `maxOpen` never counts one that the client has ended.
      Promise.resolve(answer(request, res)).then(
        () => {
          close();
          if (!res.writableEnded && !res.destroyed) res.end();
        },
        () => {
          close();
          res.destroy();
        },
      );
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  afterThisTest(async () => {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  });
  const until = (ready: () => boolean) =>
    new Promise<void>((resolve) => {
      if (ready()) resolve();
      else waiters.push({ ready, resolve });
    });
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    requests,
    get open() {
      return open;
    },
    get maxOpen() {
      return maxOpen;
    },
    received: (n) => until(() => requests.length >= n),
    opened: (n) => until(() => open >= n),
  };
}

/** The dispatcher's events in order, with waits on the next one that matches. */
export class EventLog {
  readonly events: DispatcherEvent[] = [];
  readonly #waiters: { match: (e: DispatcherEvent) => boolean; resolve: (e: DispatcherEvent) => void }[] = [];

  readonly log = (event: DispatcherEvent): void => {
    this.events.push(event);
    for (const w of [...this.#waiters]) {
      if (w.match(event)) {
        this.#waiters.splice(this.#waiters.indexOf(w), 1);
        w.resolve(event);
      }
    }
  };

  /** The first event at index >= `from` that matches (already logged, or the next to come). */
  next<T extends DispatcherEvent['type']>(
    type: T,
    from = 0,
    match: (e: Extract<DispatcherEvent, { type: T }>) => boolean = () => true,
  ): Promise<Extract<DispatcherEvent, { type: T }>> {
    const test = (e: DispatcherEvent) => e.type === type && match(e as Extract<DispatcherEvent, { type: T }>);
    const found = this.events.slice(from).find(test);
    if (found) return Promise.resolve(found as Extract<DispatcherEvent, { type: T }>);
    return new Promise((resolve) =>
      this.#waiters.push({ match: test, resolve: resolve as (e: DispatcherEvent) => void }),
    );
  }

  /** Resolves once `n` events of `type` have been logged. */
  reached(type: DispatcherEvent['type'], n: number): Promise<void> {
    if (this.count(type) >= n) return Promise.resolve();
    return new Promise((resolve) =>
      this.#waiters.push({
        match: (e) => e.type === type && this.count(type) >= n,
        resolve: () => resolve(),
      }),
    );
  }

  /** The index just after `event`, to wait for what follows it. */
  after(event: DispatcherEvent): number {
    return this.events.indexOf(event) + 1;
  }

  count(type: DispatcherEvent['type']): number {
    return this.events.filter((e) => e.type === type).length;
  }

  /** Events that report a failure inside the dispatcher (a test with any of these is broken). */
  errors(): DispatcherEvent[] {
    return this.events.filter((e) => e.type === 'error');
  }
}

/** The deliveries table, for assertions. */
export async function deliveries(db: Database) {
  return (
    await db.query<{
      id: string;
      run_id: string;
      state: string;
      attempts: number;
      last_status: number | null;
      last_error: string | null;
      lease: string | null;
    }>(
      'SELECT id, run_id, state, attempts, last_status, last_error, lease FROM callback_deliveries ORDER BY created_at',
    )
  ).rows;
}

/** The callback body for tests: the run's id, status and error. */
export function renderFrom(db: Database): CallbackDispatcherOptions['renderRun'] {
  return async (id, tenant) =>
    (
      await db.query<object>(
        'SELECT id, status, error FROM agent_runs WHERE id = $1::text AND tenant = $2::text',
        [id, tenant],
      )
    ).rows[0];
}

export const testStopTimeoutMs = 1000;

/**
 * A dispatcher on a ManualClock (started at the wall-clock time: the database stamps
 * created_at, which the maximum age is measured from), with loopback allowed (the receivers
 * are on 127.0.0.1), full-length backoff (random = 1) and a poll interval so long that only
 * due rows, notify() and finished attempts make it look. Stopped after the test, which then
 * fails if the dispatcher logged an error or left a timer behind.
 */
export function startDispatcher(
  db: Database,
  options: Partial<CallbackDispatcherOptions> & { clock?: ManualClock } = {},
): { dispatcher: CallbackDispatcher; clock: ManualClock; events: EventLog } {
  const clock = options.clock ?? new ManualClock(Date.now());
  const events = new EventLog();
  const dispatcher = new CallbackDispatcher({
    db,
    renderRun: renderFrom(db),
    allowPrivate: true,
    pollIntervalMs: 3_600_000,
    stopTimeoutMs: testStopTimeoutMs,
    random: () => 1,
    ...options,
    log: (event) => {
      events.log(event);
      options.log?.(event);
    },
    clock,
  });
  afterThisTest(async () => {
    await stopOn(dispatcher, clock);
    const errors = events.errors();
    if (errors.length > 0)
      throw new Error(
        `the dispatcher logged errors: ${String(errors.map((e) => (e as { error: unknown }).error))}`,
      );
    // A shared clock is checked by the dispatcher that made it (stopped last).
    if (!options.clock && clock.pendingTimers > 0)
      throw new Error(`the dispatcher left ${clock.pendingTimers} timer(s) behind`);
  });
  return { dispatcher, clock, events };
}

/** Stops a dispatcher on a ManualClock: its stop bound only passes when the clock moves. */
export async function stopOn(dispatcher: CallbackDispatcher, clock: ManualClock): Promise<void> {
  const stopping = dispatcher.stop();
  clock.advance(testStopTimeoutMs);
  await stopping;
}
