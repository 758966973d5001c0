import {
  MINUTE,
  SECOND,
  optionError,
  resolveLimiterOptions,
  systemClock,
  type Clock,
  type ConcurrencyLimiterOptions,
  type ResolvedLimits,
} from 'sluice/concurrency';
import { toDatabase, type Database, type DatabaseInput } from './database.js';

/** Options of {@link createPostgresConcurrencyLimiter}: the limiter's, plus where and how to store it. */
export interface PostgresConcurrencyLimiterOptions<
  W extends string = string,
> extends ConcurrencyLimiterOptions<W> {
  /** A `pg.Pool`, a PGlite instance, or any `Database`. */
  db: DatabaseInput;
  /**
   * Schema of the limiter's tables.
   * @default 'sluice'
   */
  schema?: string;
  /**
   * How often a process checks for slots while it has waiting requests and no LISTEN
   * session. One batched check per limiter per process, not one per request.
   * @default 100
   */
  pollIntervalMs?: number;
  /**
   * The same check while LISTEN wake-ups are working: then it only refreshes the queue
   * entries and catches a lost notification.
   * @default 1000 (or pollIntervalMs, if larger)
   */
  fallbackPollIntervalMs?: number;
  /**
   * How long a queue entry survives without a heartbeat (its process is gone after that).
   * @default 15000
   */
  queueEntryTtlMs?: number;
  /**
   * How long a slot offered to a waiter of another process is kept for it.
   * @default the smaller of leaseTtlMs and 5000
   */
  offerTtlMs?: number;
  /**
   * How long waiting requests ride out a database that fails or does not answer. After that
   * every request still waiting in this process fails with `ConcurrencyLimiterError`; a
   * request whose deadline comes first fails then (with `ConcurrencyLimiterError` if the
   * database is failing at that moment). No slot is ever granted without the database.
   * @default 5000
   */
  outageGraceMs?: number;
  /**
   * Create or upgrade the tables on first use (under an advisory lock). Pass `false` when
   * the role cannot run DDL, and apply `postgresConcurrencySchemaSql()` as a migration.
   * @default true
   */
  ensureSchema?: boolean;
  /**
   * What to do when the database holds different limits for this name: `'error'` refuses
   * with `ConcurrencyConfigError`; `'replace'` stores these limits (deploy every worker together).
   * @default 'error'
   */
  onConflict?: 'error' | 'replace';
  /**
   * Use LISTEN/NOTIFY to hand freed slots on at once (one extra connection per process).
   * The session is checked with a NOTIFY of its own before it is trusted, so behind a
   * transaction-mode pooler such as PgBouncer, where LISTEN cannot work, the limiter finds
   * out and polls; `false` skips the attempt.
   * @default true
   */
  listen?: boolean;
  /**
   * Whether an allocation's commit waits for its WAL flush. `false` roughly halves the time
   * the limiter's row lock is held on a disk with slow flushes; the price is that a database
   * crash can forget the grants of its last moments, so for up to one request's length more
   * requests may run than the limit allows.
   * @default true
   */
  synchronousCommit?: boolean;
}

/** Every default of the PostgreSQL limiter and its LISTEN session, in one place. */
export const postgresDefaults = Object.freeze({
  schema: 'sluice',
  pollIntervalMs: 100,
  fallbackPollIntervalMs: 1 * SECOND,
  queueEntryTtlMs: 15 * SECOND,
  /** The offer TTL is the lease TTL, capped at this. */
  maxOfferTtlMs: 5 * SECOND,
  outageGraceMs: 5 * SECOND,
  ensureSchema: true,
  onConflict: 'error' as 'error' | 'replace',
  listen: true,
  synchronousCommit: true,
  /** How long a new LISTEN session may take to receive its own test NOTIFY. */
  listenProbeMs: 1 * SECOND,
  /** After a failed probe (a transaction-mode pooler, say): when to try LISTEN again. */
  listenProbeRetryMs: 1 * MINUTE,
  /** Reconnecting a lost LISTEN session: first delay, doubled up to the second. */
  listenReconnectMs: [100, 5 * SECOND] as const,
});

/** The PostgreSQL settings after validation, frozen: all the limiter internals see. */
export interface PostgresSettings {
  readonly schema: string;
  readonly pollIntervalMs: number;
  readonly fallbackPollIntervalMs: number;
  readonly queueEntryTtlMs: number;
  readonly offerTtlMs: number;
  readonly outageGraceMs: number;
  readonly ensureSchema: boolean;
  readonly onConflict: 'error' | 'replace';
  readonly listen: boolean;
  readonly synchronousCommit: boolean;
}

export interface ResolvedPostgresOptions<W extends string> {
  readonly limits: ResolvedLimits<W>;
  readonly settings: PostgresSettings;
  /** The `db` option as given: the key of its LISTEN hub. */
  readonly db: DatabaseInput;
  readonly database: Database;
  /** Local timers and stamps: waits, polls, the outage watch. Leases and deadlines in SQL use database time. */
  readonly clock: Clock;
}

const postgresKeys: ReadonlySet<string> = new Set([
  'db',
  'schema',
  'pollIntervalMs',
  'fallbackPollIntervalMs',
  'queueEntryTtlMs',
  'offerTtlMs',
  'outageGraceMs',
  'ensureSchema',
  'onConflict',
  'listen',
  'synchronousCommit',
]);

const identifier = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;

/**
 * Validates every option of the PostgreSQL limiter, the limiter's own (through
 * `resolveLimiterOptions`) and the storage ones, each against the others too. Throws
 * `ConcurrencyConfigError` naming the field, what was expected and what came.
 */
export function resolvePostgresLimiterOptions<W extends string>(
  options: PostgresConcurrencyLimiterOptions<W>,
): ResolvedPostgresOptions<W> {
  const limits = resolveLimiterOptions(options, postgresKeys);
  const fail = (field: string, expected: string, value: unknown): never => {
    throw optionError(limits.name, field, expected, value);
  };
  const wholeNumber = (field: string, value: unknown, fallback: number, min: number, why = ''): number => {
    if (value === undefined) return fallback;
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min) {
      fail(field, `a whole number >= ${min}${why}`, value);
    }
    return value as number;
  };
  const flag = (field: string, value: unknown, fallback: boolean): boolean => {
    if (value === undefined) return fallback;
    if (typeof value !== 'boolean') fail(field, 'true or false', value);
    return value as boolean;
  };

  const db: unknown = options.db;
  let database: Database | undefined;
  try {
    database = typeof db === 'object' && db !== null ? toDatabase(db as DatabaseInput) : undefined;
  } catch {
    database = undefined;
  }
  if (database === undefined) fail('db', 'a pg.Pool, a PGlite instance or a Database', db);
  const schema: unknown = options.schema ?? postgresDefaults.schema;
  if (typeof schema !== 'string' || !identifier.test(schema)) {
    fail('schema', 'a plain SQL identifier (letters, digits, _; at most 63)', schema);
  }
  const onConflict: unknown = options.onConflict ?? postgresDefaults.onConflict;
  if (onConflict !== 'error' && onConflict !== 'replace') {
    fail('onConflict', "'error' or 'replace'", onConflict);
  }
  const pollIntervalMs = wholeNumber(
    'pollIntervalMs',
    options.pollIntervalMs,
    postgresDefaults.pollIntervalMs,
    1,
  );
  const settings: PostgresSettings = Object.freeze({
    schema: schema as string,
    pollIntervalMs,
    // The fallback poll is the slow one: never faster than the routine poll.
    fallbackPollIntervalMs: wholeNumber(
      'fallbackPollIntervalMs',
      options.fallbackPollIntervalMs,
      Math.max(postgresDefaults.fallbackPollIntervalMs, pollIntervalMs),
      pollIntervalMs,
      ' (pollIntervalMs)',
    ),
    queueEntryTtlMs: wholeNumber(
      'queueEntryTtlMs',
      options.queueEntryTtlMs,
      postgresDefaults.queueEntryTtlMs,
      1,
    ),
    offerTtlMs: wholeNumber(
      'offerTtlMs',
      options.offerTtlMs,
      Math.min(limits.leaseTtlMs, postgresDefaults.maxOfferTtlMs),
      1,
    ),
    outageGraceMs: wholeNumber('outageGraceMs', options.outageGraceMs, postgresDefaults.outageGraceMs, 0),
    ensureSchema: flag('ensureSchema', options.ensureSchema, postgresDefaults.ensureSchema),
    onConflict: onConflict as 'error' | 'replace',
    listen: flag('listen', options.listen, postgresDefaults.listen),
    synchronousCommit: flag(
      'synchronousCommit',
      options.synchronousCommit,
      postgresDefaults.synchronousCommit,
    ),
  });
  return Object.freeze({
    limits,
    settings,
    db: db as DatabaseInput,
    database: database!,
    clock: options.clock ?? systemClock,
  });
}
