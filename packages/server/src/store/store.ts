import { randomBytes } from 'node:crypto';
import {
  closeSync,
  existsSync,
  linkSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeSync,
} from 'node:fs';
import { dirname } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { PGlite } from '@electric-sql/pglite';
import pg from 'pg';
import { systemClock } from 'sluice/concurrency';
import { settingDefaults } from '../settings.js';
import { tuning } from '../tuning.js';
import { fromPgPool, splitSqlStatements, toDatabase, type Database } from '@sluice/postgres/database';
import { dropIdleOnStall } from './stalls.js';

// Beside src/ and dist/ alike, so the source and the built package read the same files.
const migrationsDir = new URL('../../sql/', import.meta.url);

export interface Store {
  readonly db: Database;
  /**
   * No other process can write this database (embedded PGlite, held by a lock file): new work
   * comes from this process, which wakes its own workers, and every notification is heard in it.
   * Polls that stand in for another process's work may then be far apart.
   */
  readonly solo?: boolean;
  /** Whether the database answers now (for /readyz): a `SELECT 1` bounded in time. */
  ping(timeoutMs?: number): Promise<boolean>;
  close(): Promise<void>;
}

export interface StoreOptions {
  /** PostgreSQL; without it, embedded PGlite in `dataDir`. */
  databaseUrl?: string;
  dataDir: string;
  /** The longest a statement or a lock wait may take (PostgreSQL only). @default 15000 */
  statementTimeoutMs?: number;
  /** @default 20 */
  poolSize?: number;
  /**
   * Prepares the statements marked `prepared()` once per connection, on a direct connection
   * only: never behind a pooler that refuses settings at connect (PgBouncer). @default true
   */
  preparedStatements?: boolean;
  /**
   * Errors of idle connections (a restarted or terminated server), and each failed attempt to
   * reach a database that is not up yet: reported, never thrown.
   */
  onError?: (error: Error) => void;
  /** Something an operator should know about how the store connected. */
  onNotice?: (message: string) => void;
  /** Stops waiting for a PostgreSQL server that is not up yet (a signal during start-up). */
  signal?: AbortSignal;
}

/**
 * Opens the server's database: PostgreSQL when `databaseUrl` is set, else embedded PGlite in
 * `dataDir`. Applies the numbered migrations that are missing, one transaction each, under an
 * advisory lock, so several servers booting at once apply each exactly once.
 */
export async function openStore(options: StoreOptions): Promise<Store> {
  if (options.databaseUrl) return openPostgres(options.databaseUrl, options);
  return openEmbedded(options.dataDir);
}

/** How long past its statement timeout a statement's answer may take before its connection counts as gone. */
const STALLED_MARGIN_MS = 1000;

/**
 * How long a session may sit idle inside a transaction: two thirds of the lock timeout (the
 * statement timeout), so that a peer waiting on the locks of a client gone silent gets them
 * before its own wait fails with 503 (the soak's db_stall: at one minute, a peer's admissions
 * failed for up to a minute after the stall). Never under tuning.idleInTransactionFloorMs, so
 * that an event loop held up between two statements does not lose its transaction: with a
 * statement timeout of 5 s or less that floor is not below the lock timeout, and a peer
 * waiting on a silent client's lock is answered 503 before the lock is freed.
 */
function idleInTransactionMs(statementTimeoutMs: number): number {
  return Math.max(tuning.idleInTransactionFloorMs, Math.round((statementTimeoutMs * 2) / 3));
}

/** How the store's connections get their timeouts: in the startup packet, or per transaction. */
type TimeoutsAt = 'startup' | 'transaction';

const statementTimeoutOf = (options: StoreOptions) =>
  options.statementTimeoutMs ?? settingDefaults.statementTimeoutMs;

function poolOf(url: string, options: StoreOptions, at: TimeoutsAt): { pool: pg.Pool; db: Database } {
  const statementTimeout = statementTimeoutOf(options);
  const timeouts = {
    statement_timeout: statementTimeout,
    // Lock waits (the tenant admission lock above all) are bounded too: a stuck holder makes
    // callers fail with 503 instead of queueing behind it forever.
    lock_timeout: statementTimeout,
    idle_in_transaction_session_timeout: idleInTransactionMs(statementTimeout),
  };
  const pool = new pg.Pool({
    connectionString: url,
    max: options.poolSize ?? 20,
    // Waiting for a connection (a new one, or a free one of a busy pool) ends after this, with 503.
    connectionTimeoutMillis: 30_000,
    // PostgreSQL ends a statement at its statement timeout, but on a connection gone silent with
    // no reset (a partition, a NAT that forgot it) that answer never comes: without a bound of
    // our own the statement waits for ever, and the pool's connections hang one by one. A
    // statement unanswered a second past the timeout fails, and its connection is dropped.
    query_timeout: statementTimeout + STALLED_MARGIN_MS,
    ...(at === 'startup' ? timeouts : {}),
  });
  // An idle connection that the server ends (restart, pg_terminate_backend, a proxy's reaper)
  // is emitted here; with no listener Node would end the process.
  pool.on('error', (error) => options.onError?.(error));
  dropIdleOnStall(pool);
  const perTransaction = Object.fromEntries(Object.entries(timeouts).map(([name, ms]) => [name, `${ms}ms`]));
  return {
    pool,
    db:
      at === 'startup'
        ? fromPgPool(pool, { preparedStatements: options.preparedStatements ?? true })
        : fromPgPool(pool, { transactionSettings: perTransaction }),
  };
}

/**
 * PgBouncer (and other poolers) refuse settings in the startup packet: "unsupported startup
 * parameter". A protocol error, not a database still starting, so it is not worth a retry.
 */
const refusesStartupSettings = (error: unknown): boolean =>
  /unsupported startup parameter/i.test((error as Error)?.message ?? '');

/**
 * The statement timeout a session has when it is not the one its connection asked for
 * (undefined when it is). A pooler told to accept settings at connect and drop them
 * (PgBouncer's `ignore_startup_parameters`, the usual answer to the refusal above) connects
 * without a word and leaves every statement unbounded. It is also a pooler, so its sessions
 * are shared: no prepared statements there either.
 */
async function appliedAtConnect(db: Database, statementTimeoutMs: number): Promise<string | undefined> {
  const { rows } = await db.query<{ applied: boolean; setting: string }>(
    `SELECT current_setting('statement_timeout')::interval = $1::float8 * interval '1 millisecond' AS applied,
            current_setting('statement_timeout') AS setting`,
    [statementTimeoutMs],
  );
  return rows[0]!.applied ? undefined : rows[0]!.setting;
}

async function openPostgres(url: string, options: StoreOptions): Promise<Store> {
  let { pool, db } = poolOf(url, options, 'startup');
  let at: TimeoutsAt = 'startup';
  // A server started beside its database (compose, a pod) may come up first: keep trying to
  // reach it for a while before giving up.
  // Before the app and its clock exist: the system clock's time.
  const giveUpAt = systemClock.now() + tuning.storeConnectGiveUpMs;
  for (let delay = 250; ; delay = Math.min(delay * 2, 5_000)) {
    try {
      await migrate(db);
      const dropped = at === 'startup' ? await appliedAtConnect(db, statementTimeoutOf(options)) : undefined;
      if (dropped === undefined) break;
      await pool.end().catch(() => undefined);
      ({ pool, db } = poolOf(url, options, 'transaction'));
      at = 'transaction';
      options.onNotice?.(
        `the database accepted settings at connect time but did not apply them (statement_timeout is ${dropped}), ` +
          "as a pooler's ignore_startup_parameters does: each transaction sets its statement and lock timeouts " +
          'itself, and no statement is prepared; set the timeouts on the role for single statements',
      );
    } catch (error) {
      if (at === 'startup' && refusesStartupSettings(error)) {
        // Behind a pooler in transaction mode: each transaction sets its own timeouts, and a
        // statement outside a transaction has the role's (see docs/deploy.md).
        await pool.end().catch(() => undefined);
        ({ pool, db } = poolOf(url, options, 'transaction'));
        at = 'transaction';
        options.onNotice?.(
          `the database refuses settings at connect time (${(error as Error).message}), as PgBouncer in transaction ` +
            'mode does: each transaction sets its statement and lock timeouts itself; set them on the role for ' +
            'single statements (ALTER ROLE ... SET statement_timeout = ...)',
        );
        continue;
      }
      if (!isConnectionError(error) || systemClock.now() + delay > giveUpAt) {
        await pool.end().catch(() => undefined);
        throw error;
      }
      options.onError?.(error as Error);
      try {
        await sleep(delay, undefined, { signal: options.signal });
      } catch (aborted) {
        await pool.end().catch(() => undefined);
        throw aborted;
      }
    }
  }
  const opened = pool;
  return { db, ping: (timeoutMs) => ping(db, timeoutMs), close: () => opened.end() };
}

async function openEmbedded(dataDir: string): Promise<Store> {
  // Run data is private to the user that runs the server.
  mkdirSync(dirname(dataDir), { recursive: true, mode: 0o700 });
  const lock = `${dataDir}.lock`;
  takeLock(lock, dataDir);
  let handle: PGlite | undefined;
  try {
    mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    handle = new PGlite(dataDir);
    await handle.waitReady;
    const db = toDatabase(handle);
    await migrate(db);
    const opened = handle;
    return {
      db,
      solo: true,
      ping: (timeoutMs) => ping(db, timeoutMs),
      close: async () => {
        await opened.close();
        releaseLock(lock);
      },
    };
  } catch (error) {
    await handle?.close().catch(() => undefined);
    releaseLock(lock);
    throw error;
  }
}

/** The lock files this process holds: its own pid in one means in use, not left over. */
const heldLocks = new Set<string>();

function releaseLock(lock: string): void {
  rmSync(lock, { force: true });
  heldLocks.delete(lock);
}

/**
 * Embedded PGlite is one process's database. The lock file appears at once with its content (a
 * complete file is hard-linked into place, which fails if one is there), so two processes
 * starting at once cannot both pass, nor read a lock that is still empty. A lock left by a dead
 * process is taken over, also one with this process's pid (a container's PID 1 of an earlier
 * boot) unless this process holds it.
 */
function takeLock(lock: string, dataDir: string): void {
  const draft = `${lock}.${process.pid}.${randomBytes(4).toString('hex')}`;
  const fd = openSync(draft, 'wx', 0o600);
  try {
    writeSync(fd, String(process.pid));
  } finally {
    closeSync(fd);
  }
  try {
    for (let attempt = 0; attempt < 2; attempt++) {
      try {
        linkSync(draft, lock);
        heldLocks.add(lock);
        return;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
        let pid: number;
        try {
          pid = Number(readFileSync(lock, 'utf8'));
        } catch (gone) {
          // Released between the two calls: try again.
          if ((gone as NodeJS.ErrnoException).code === 'ENOENT') continue;
          throw gone;
        }
        if ((pid === process.pid && heldLocks.has(lock)) || (pid !== process.pid && isAlive(pid))) {
          throw new Error(
            `The embedded database ${dataDir} is in use by process ${pid} (a running server?). ` +
              'Stop it first, or set DATABASE_URL to share a PostgreSQL server.',
          );
        }
        rmSync(lock, { force: true });
      }
    }
    throw new Error(`Could not take the lock ${lock}`);
  } finally {
    rmSync(draft, { force: true });
  }
}

function isConnectionError(error: unknown): boolean {
  const e = error as { code?: string; message?: string };
  return (
    /^(08|57P0)/.test(e?.code ?? '') ||
    ['ECONNREFUSED', 'ECONNRESET', 'EAGAIN', 'ENOENT', 'ETIMEDOUT'].includes(e?.code ?? '') ||
    /connection timeout|Connection terminated|the database system is (starting up|shutting down)/i.test(
      e?.message ?? '',
    )
  );
}

function isAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function ping(db: Database, timeoutMs = 2_000): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      // Answering is not enough: a database that lost its primary role answers but refuses writes.
      db
        .query<{ writable: boolean }>("SELECT current_setting('transaction_read_only') = 'off' AS writable")
        .then((r) => r.rows[0]?.writable === true),
      new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), timeoutMs))),
    ]);
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A migration waits this long for a lock, then gives up and is tried again: while other
 * processes (older versions of the server) keep working, a migration that locks two tables can
 * meet one of their transactions holding the second while it waits for the first. Shorter than
 * PostgreSQL's deadlock check (1 s by default), so it is the migration that steps back, not
 * their work.
 */
const MIGRATION_LOCK_TIMEOUT_MS = 500;
/** Tries of one migration that met a lock (deadlock or lock timeout), with a growing pause. */
const MIGRATION_TRIES = 40;

/** A migration that failed on a lock, not on its SQL: tried again. */
const lockConflict = (error: unknown) =>
  ['40P01', '55P03'].includes((error as { code?: string } | undefined)?.code ?? '');

export async function migrate(db: Database): Promise<void> {
  if (!existsSync(migrationsDir))
    throw new Error(`The server's migrations are missing: ${migrationsDir.pathname}`);
  const files = readdirSync(migrationsDir)
    .filter((f) => /^\d+_.*\.sql$/.test(f))
    .sort();
  for (const file of files) {
    for (let attempt = 1; ; attempt++) {
      try {
        await migrateOne(db, file);
        break;
      } catch (error) {
        if (!lockConflict(error) || attempt >= MIGRATION_TRIES) throw error;
        await new Promise((resolve) => setTimeout(resolve, Math.min(50 * attempt, 1_000)));
      }
    }
  }
}

async function migrateOne(db: Database, file: string): Promise<void> {
  const version = Number(file.split('_')[0]);
  await db.transaction(async (tx) => {
    await tx.query('SELECT pg_advisory_xact_lock(hashtext($1::text))', ['sluice:server:migrations']);
    await tx.query(
      'CREATE TABLE IF NOT EXISTS schema_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT clock_timestamp())',
    );
    const done = await tx.query<{ n: number }>(
      'SELECT count(*)::int AS n FROM schema_migrations WHERE version = $1::int',
      [version],
    );
    if (done.rows[0]!.n > 0) return;
    // After the migrations' own lock, which a peer migrating holds as long as it takes.
    await tx.query(`SET LOCAL lock_timeout = ${MIGRATION_LOCK_TIMEOUT_MS}`);
    for (const statement of splitSqlStatements(readFileSync(new URL(file, migrationsDir), 'utf8'))) {
      await tx.query(statement);
    }
    await tx.query('INSERT INTO schema_migrations (version) VALUES ($1::int)', [version]);
  });
}
