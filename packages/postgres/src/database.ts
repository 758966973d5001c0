/**
 * The one small query interface the PostgreSQL limiter needs, with adapters for
 * node-postgres (`pg.Pool`) and embedded PGlite.
 */
import { createHash } from 'node:crypto';

export interface QueryResult<R> {
  rows: R[];
}

export interface SqlClient {
  query<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<QueryResult<R>>;
}

export interface Notification {
  channel: string;
  payload: string;
}

/** A dedicated LISTEN session. `onLost` fires once when the session breaks. */
export interface ListenSession {
  close(): Promise<void>;
}

/** How a LISTEN session checks that its connection still answers. */
export interface ListenOptions {
  /**
   * How often the session asks the database for an answer; a connection dropped without a
   * reset (an idle-timeout NAT, a partition) is noticed only this way.
   * @default 30_000
   */
  checkEveryMs?: number;
  /**
   * How long that answer may take before the session counts as lost.
   * @default 10_000
   */
  checkTimeoutMs?: number;
}

export interface TransactionOptions {
  synchronousCommit?: boolean;
}

export interface Database extends SqlClient {
  /**
   * Runs `body` in one READ COMMITTED transaction on one connection. With
   * `synchronousCommit: false` the commit does not wait for the WAL flush.
   */
  transaction<T>(body: (tx: SqlClient) => Promise<T>, options?: TransactionOptions): Promise<T>;
  /**
   * Opens a session that receives NOTIFY on `channel`. Optional: without it, polling alone
   * keeps the limiter correct, only slower to hand slots on.
   */
  listen?(
    channel: string,
    onNotify: (payload: string) => void,
    onLost: (error: unknown) => void,
    options?: ListenOptions,
  ): Promise<ListenSession>;
}

// Structural types, so neither driver is a hard dependency.
/** A node-postgres query config naming its statement. */
interface NamedQuery {
  name: string;
  text: string;
  values?: unknown[];
}
interface PgPoolLike {
  query(text: string | NamedQuery, params?: unknown[]): Promise<{ rows: unknown[] }>;
  connect(): Promise<PgPoolClientLike>;
  connect(callback: (error: Error | undefined, client: PgPoolClientLike) => void): void;
  options?: object;
  totalCount?: number;
}
interface PgPoolClientLike {
  query(text: string | NamedQuery, params?: unknown[]): Promise<{ rows: unknown[] }>;
  release(error?: Error | boolean): void;
  on?(event: 'error', listener: (error: Error) => void): unknown;
  removeListener?(event: 'error', listener: (error: Error) => void): unknown;
}
interface PgClientLike {
  connect(): Promise<unknown>;
  query(text: string): Promise<unknown>;
  end(): Promise<void>;
  on(event: 'notification', listener: (n: { channel: string; payload?: string }) => void): unknown;
  on(event: 'error' | 'end', listener: (error?: unknown) => void): unknown;
  /** node-postgres's connection; its socket is destroyed when it stops answering. */
  connection?: { stream?: { destroy(): void } };
}
interface PGliteLike {
  query<R>(text: string, params?: unknown[]): Promise<{ rows: R[] }>;
  transaction<T>(
    body: (tx: { query<R>(text: string, params?: unknown[]): Promise<{ rows: R[] }> }) => Promise<T>,
  ): Promise<T>;
  listen(channel: string, callback: (payload: string) => void): Promise<() => Promise<void>>;
  waitReady?: Promise<void>;
}

export type DatabaseInput = Database | PgPoolLike | PGliteLike;

function isPGlite(db: object): db is PGliteLike {
  const d = db as PGliteLike & { exec?: unknown };
  return (
    typeof d.exec === 'function' && typeof d.listen === 'function' && typeof d.transaction === 'function'
  );
}

function isPgPool(db: object): db is PgPoolLike {
  return typeof (db as PgPoolLike).connect === 'function' && 'totalCount' in db;
}

function isDatabase(db: object): db is Database {
  return typeof (db as Database).transaction === 'function' && typeof (db as Database).query === 'function';
}

/** Wraps a `pg.Pool`, a PGlite instance or a ready-made `Database`. */
export function toDatabase(db: DatabaseInput): Database {
  if (isPGlite(db)) return fromPGlite(db);
  if (isPgPool(db)) return fromPgPool(db);
  if (isDatabase(db)) return db;
  throw new TypeError('Expected `db` to be a pg.Pool, a PGlite instance or a Database, got ' + typeof db);
}

function quoteIdent(name: string): string {
  return `"${name.replace(/"/g, '""')}"`;
}

export interface PgPoolOptions {
  /**
   * Settings each transaction sets for itself (`SET LOCAL`, in the same round trip as its
   * BEGIN), e.g. `{ lock_timeout: '5000ms' }`: what a session setting would do, for a pooler in
   * transaction mode, which refuses settings in the startup packet and shares sessions.
   */
  transactionSettings?: Record<string, string>;
  /**
   * Sends the statements marked with `prepared()` as named statements, parsed and planned once
   * per connection. Only for connections that are sessions of their own: behind a pooler in
   * transaction mode a statement prepared on one server connection is missing on the next.
   * Should a statement be missing there anyway, the pool stops naming statements.
   * @default false
   */
  preparedStatements?: boolean;
}

/**
 * The texts marked as prepared, each with its statement name. Bounded by the code that marks
 * them: mark only a text built once (a constant, or one text per setting), never one built per
 * call, since every connection keeps each statement it has prepared. A name is a hash of its
 * text, the same in every process and version: a server session that a pooler shares between
 * processes never holds another text under a name this process uses.
 */
const preparedNames = new Map<string, string>();

/**
 * Marks `text` as a statement worth preparing: a pool opened with `preparedStatements` sends it
 * as a named statement, parsed and planned once per connection (PostgreSQL then keeps a generic
 * plan when it costs no more than planning each time). Returns `text` itself, so a marked
 * constant is used as before everywhere else (PGlite, a pooler in transaction mode). Its result
 * columns must be listed, not a table's `*`: a prepared statement whose result would change
 * fails ("cached plan must not change result type") once a migration adds a column.
 */
export function prepared(text: string): string {
  if (!preparedNames.has(text))
    preparedNames.set(text, `sluice_${createHash('sha256').update(text).digest('hex').slice(0, 32)}`);
  return text;
}

/**
 * PostgreSQL's "prepared statement does not exist" (26000) or "already exists" (42P05): the
 * server session under a connection changed, as behind a pooler in transaction mode. Both
 * come before the statement runs.
 */
const sessionChanged = (error: unknown) =>
  ['26000', '42P05'].includes((error as { code?: string } | undefined)?.code ?? '');

/**
 * A prepared statement whose result no longer fits its table (0A000 "cached plan must not
 * change result type", 42804 a wrong type): a migration changed a column's type under it. The
 * connection keeps failing it, so it is dropped (outside a transaction the pool drops a client
 * whose statement failed on its own).
 */
const staleStatement = (error: unknown) =>
  ['0A000', '42804'].includes((error as { code?: string } | undefined)?.code ?? '');

/** `SET LOCAL name TO 'value'` for each setting; names are checked, values quoted as literals. */
function setLocal(settings: Record<string, string> = {}): string {
  return Object.entries(settings)
    .map(([name, value]) => {
      if (!/^[a-z_]+$/.test(name)) throw new TypeError(`Expected a setting name, got \`${name}\``);
      return `; SET LOCAL ${name} TO '${String(value).replace(/'/g, "''")}'`;
    })
    .join('');
}

/**
 * A client of the pool with `onError` listening from the moment it is handed over. The pool
 * hands a client on inside the read that ended its last statement: a promise's continuation
 * would attach the listener only after the rest of that read is parsed, and a termination in
 * it (pg_terminate_backend, a restart) would be emitted with nobody listening.
 */
function checkOut(pool: PgPoolLike, onError: (error: Error) => void): Promise<PgPoolClientLike> {
  return new Promise((resolve, reject) => {
    pool.connect((error, client) => {
      if (error) return reject(error);
      client.on?.('error', onError);
      resolve(client);
    });
  });
}

export function fromPgPool(pool: PgPoolLike, poolOptions: PgPoolOptions = {}): Database {
  const settings = setLocal(poolOptions.transactionSettings);
  let naming = poolOptions.preparedStatements === true;
  /** The statement as node-postgres takes it: named when marked and the pool names statements. */
  const statement = (text: string, params?: unknown[]): [string | NamedQuery, unknown[]?] => {
    const name = naming ? preparedNames.get(text) : undefined;
    return name === undefined ? [text, params] : [{ name, text, values: params }];
  };
  /**
   * A named statement its server session did not have, or had already (a pooler in transaction
   * mode after all): PostgreSQL refuses it before running anything, so the pool stops naming
   * statements, and a statement outside a transaction is sent again unnamed.
   */
  const unnamedAfterMissing = (error: unknown, named: boolean): boolean => {
    if (!named || !sessionChanged(error)) return false;
    naming = false;
    return true;
  };
  /**
   * One statement on a pooled connection, as the pool's own `query` runs it, except that a
   * failure to get the connection is marked `neverSent`: a caller that must learn what a lost
   * statement did (runs/admission-settle.ts in the server) has nothing to learn then.
   */
  const once = async (text: string | NamedQuery, values?: unknown[]) => {
    let failed: Error | undefined;
    const onError = (error: Error) => (failed = error);
    const client = await checkOut(pool, onError).catch((error: unknown) => {
      if (error instanceof Error) Object.defineProperty(error, 'neverSent', { value: true });
      throw error;
    });
    try {
      const result = await client.query(text, values);
      client.removeListener?.('error', onError);
      client.release();
      return result;
    } catch (error) {
      client.removeListener?.('error', onError);
      // Released with its error, the connection is dropped rather than handed to the next caller.
      client.release((failed ?? error) as Error);
      throw error;
    }
  };
  return {
    async query<R>(text: string, params?: unknown[]) {
      const [first, values] = statement(text, params);
      try {
        return (await once(first, values)) as QueryResult<R>;
      } catch (error) {
        if (!unnamedAfterMissing(error, typeof first !== 'string')) throw error;
        return (await once(text, params)) as QueryResult<R>;
      }
    },
    async transaction<T>(body: (tx: SqlClient) => Promise<T>, options?: TransactionOptions): Promise<T> {
      let broken: Error | undefined;
      // node-postgres emits 'error' on a checked-out client whose connection drops between two
      // queries, and the pool listens only while the client is idle: without a listener of
      // our own, a terminated backend would end the process. The next query fails instead.
      const onError = (error: Error) => (broken = error);
      const client = await checkOut(pool, onError);
      try {
        // Stated explicitly: allocation reads must see rows committed before the row lock
        // was granted, which an older (REPEATABLE READ) snapshot would not. SET LOCAL lasts
        // for this transaction only: no session state is left behind for a pooler.
        await client.query(
          (options?.synchronousCommit === false
            ? 'BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL synchronous_commit TO off'
            : 'BEGIN ISOLATION LEVEL READ COMMITTED') + settings,
        );
        const tx: SqlClient = {
          async query<R>(text: string, params?: unknown[]) {
            const [first, values] = statement(text, params);
            try {
              return (await client.query(first, values)) as QueryResult<R>;
            } catch (error) {
              const named = typeof first !== 'string';
              // The transaction is aborted: it fails, and the next ones name nothing.
              unnamedAfterMissing(error, named);
              if (named && staleStatement(error)) broken = error as Error;
              throw error;
            }
          },
        };
        const result = await body(tx);
        await client.query('COMMIT');
        return result;
      } catch (error) {
        // A statement whose answer never came (the driver's `query_timeout`): the connection
        // has gone silent, and a ROLLBACK sent on it would wait out the same bound. It is
        // dropped instead; the server ends the transaction when the session goes.
        if ((error as Error | undefined)?.message === 'Query read timeout') {
          broken = error as Error;
          throw error;
        }
        try {
          await client.query('ROLLBACK');
        } catch (rollbackError) {
          broken = rollbackError instanceof Error ? rollbackError : new Error(String(rollbackError));
        }
        throw error;
      } finally {
        client.removeListener?.('error', onError);
        client.release(broken);
      }
    },
    async listen(channel, onNotify, onLost, options = {}) {
      // LISTEN needs a session of its own, outside the pool (and outside any transaction pooler).
      const pg = (await import('pg')).default;
      const client = new pg.Client(
        pool.options as ConstructorParameters<typeof pg.Client>[0],
      ) as unknown as PgClientLike;
      let closed = false;
      let lost = false;
      // onLost is for a session that was open: a connect or LISTEN that fails rejects instead,
      // so its caller hears of each failed attempt once (an 'error' and an 'end' come with it).
      let open = false;
      let check: ReturnType<typeof setInterval> | undefined = undefined;
      const lose = (error: unknown) => {
        if (closed || lost) return;
        lost = true;
        clearInterval(check);
        client.end().catch(() => undefined);
        if (open) onLost(error);
      };
      client.on('error', lose);
      client.on('end', () => lose(new Error('LISTEN connection ended')));
      client.on('notification', (n) => {
        if (n.channel === channel && n.payload !== undefined) onNotify(n.payload);
      });
      try {
        await client.connect();
        await client.query(`LISTEN ${quoteIdent(channel)}`);
      } catch (error) {
        lose(error);
        throw error;
      }
      if (lost) throw new Error('LISTEN connection ended');
      open = true;
      // A connection cut without a reset looks idle forever: ask for an answer now and then,
      // and count the session lost when none comes in time.
      const timeoutMs = options.checkTimeoutMs ?? 10_000;
      let checking = false;
      check = setInterval(() => {
        if (checking) return;
        checking = true;
        const late = setTimeout(() => {
          lose(new Error(`LISTEN connection did not answer within ${timeoutMs} ms`));
          // A polite end waits for a peer that is not there: the socket would stay open.
          client.connection?.stream?.destroy();
        }, timeoutMs);
        late.unref();
        client
          .query('SELECT 1')
          .catch(lose)
          .finally(() => {
            clearTimeout(late);
            checking = false;
          });
      }, options.checkEveryMs ?? 30_000);
      check.unref();
      return {
        async close() {
          closed = true;
          clearInterval(check);
          await client.end().catch(() => undefined);
        },
      };
    },
  };
}

export function fromPGlite(db: PGliteLike): Database {
  return {
    query: (text, params) => db.query(text, params),
    transaction: (body, options) =>
      db.transaction(async (tx) => {
        await tx.query('SET TRANSACTION ISOLATION LEVEL READ COMMITTED');
        if (options?.synchronousCommit === false) await tx.query('SET LOCAL synchronous_commit TO off');
        return body({ query: (text, params) => tx.query(text, params) });
      }),
    async listen(channel, onNotify) {
      const unlisten = await db.listen(channel, onNotify);
      return { close: () => unlisten() };
    },
  };
}
