import { randomBytes } from 'node:crypto';
import type { Database, ListenSession } from './database.js';
import { postgresDefaults } from './options.js';

/** An offer announced by NOTIFY: lease `id` of limiter `l` for waiter `w`. */
export interface OfferNotice {
  l: string;
  w: string;
  id: string;
}

interface HubMember {
  readonly name: string;
  onOffers(notices: OfferNotice[]): void;
  onListenChange(listening: boolean): void;
}

export const channelPrefix = 'sluice_limiter_';

/**
 * What the limiters of one process share per database: an owner id that names this process
 * in the queue, and at most one LISTEN session, on a channel of its own, so that a NOTIFY
 * wakes only the process it concerns.
 *
 * The session is a latency hint only. When it breaks, members fall back to polling at
 * their fast interval while the hub reconnects with backoff; after reconnecting, members
 * poll once to catch what was sent meanwhile.
 *
 * A new session is trusted only once it has received a NOTIFY of its own, sent through the
 * pool. Behind a transaction-mode pooler (PgBouncer) LISTEN runs on whichever server
 * connection is free and its notifications go nowhere: the probe times out, the session is
 * closed, members poll, and LISTEN is tried again much later.
 *
 * The hub serves every limiter of a pool, whatever their clocks, and its timers measure
 * network waits: they are Node's own.
 */
export class ListenHub {
  readonly owner = randomBytes(6).toString('hex');
  readonly channel = `${channelPrefix}${this.owner}`;
  listening = false;

  readonly #members = new Set<HubMember>();
  #session: ListenSession | undefined;
  #connecting: Promise<void> | undefined;
  #retryTimer: ReturnType<typeof setTimeout> | undefined;
  #backoffMs: number = postgresDefaults.listenReconnectMs[0];
  #pending: OfferNotice[] = [];
  #probe: { token: string; settle(received: boolean): void } | undefined;
  /** When a probe last failed (performance.now()): LISTEN is not tried again before the retry delay. */
  #probeFailedAt = -Infinity;
  #closed = false;

  constructor(private readonly db: Database) {}

  join(member: HubMember): void {
    this.#members.add(member);
    this.#closed = false;
  }

  async leave(member: HubMember): Promise<void> {
    this.#members.delete(member);
    if (this.#members.size > 0) return;
    this.#closed = true;
    this.#probe?.settle(false);
    clearTimeout(this.#retryTimer);
    this.#retryTimer = undefined;
    await this.#connecting?.catch(() => undefined);
    // A limiter that joined meanwhile keeps the hub (and its session) open.
    if (this.#members.size > 0) return;
    const session = this.#session;
    this.#session = undefined;
    this.#setListening(false);
    await session?.close();
  }

  /** Starts listening if it is not already; resolves once connected or failed. */
  ensureListening(): Promise<void> {
    const probeFailedRecently = performance.now() - this.#probeFailedAt < postgresDefaults.listenProbeRetryMs;
    if (this.#closed || !this.db.listen || this.#session || this.#retryTimer || probeFailedRecently)
      return this.#connecting ?? Promise.resolve();
    this.#connecting ??= this.#connect().finally(() => (this.#connecting = undefined));
    return this.#connecting;
  }

  async #connect(): Promise<void> {
    let session: ListenSession | undefined;
    try {
      session = await this.db.listen!(
        this.channel,
        (payload) => this.#onNotify(payload),
        () => this.#onLost(session),
      );
      if (!this.#closed && !(await this.#probeSession())) {
        await session.close();
        if (!this.#closed) {
          this.#probeFailedAt = performance.now();
          this.#scheduleReconnect(postgresDefaults.listenProbeRetryMs);
        }
        return;
      }
      if (this.#closed) {
        await session.close();
        return;
      }
      this.#session = session;
      this.#backoffMs = postgresDefaults.listenReconnectMs[0];
      this.#setListening(true);
    } catch {
      await session?.close().catch(() => undefined);
      this.#scheduleReconnect();
    }
  }

  /** Whether a NOTIFY sent through the pool reaches the new session in time. */
  async #probeSession(): Promise<boolean> {
    const token = randomBytes(6).toString('hex');
    let timer: ReturnType<typeof setTimeout> | undefined;
    const received = new Promise<boolean>((resolve) => {
      this.#probe = { token, settle: resolve };
      timer = setTimeout(() => resolve(false), postgresDefaults.listenProbeMs);
      timer.unref();
    });
    try {
      await this.db.query('SELECT pg_notify($1::text, $2::text)', [
        this.channel,
        JSON.stringify({ probe: token }),
      ]);
      return await received;
    } finally {
      clearTimeout(timer);
      this.#probe = undefined;
    }
  }

  #onLost(session: ListenSession | undefined): void {
    // A session that never passed its probe is not the hub's yet.
    if (session === undefined || session !== this.#session) return;
    this.#session = undefined;
    this.#setListening(false);
    this.#scheduleReconnect();
  }

  #scheduleReconnect(delay?: number): void {
    if (this.#closed || this.#retryTimer) return;
    if (delay === undefined) {
      delay = this.#backoffMs;
      this.#backoffMs = Math.min(this.#backoffMs * 2, postgresDefaults.listenReconnectMs[1]);
    }
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = undefined;
      void this.ensureListening();
    }, delay);
    this.#retryTimer.unref();
  }

  #setListening(listening: boolean): void {
    if (this.listening === listening) return;
    this.listening = listening;
    for (const member of this.#members) member.onListenChange(listening);
  }

  // Notices of one tick are handed over together, so a member claims them in one statement.
  #onNotify(payload: string): void {
    let notice: OfferNotice & { probe?: string };
    try {
      notice = JSON.parse(payload) as OfferNotice & { probe?: string };
    } catch {
      return;
    }
    if (notice.probe !== undefined) {
      if (notice.probe === this.#probe?.token) this.#probe.settle(true);
      return;
    }
    if (this.#pending.push(notice) > 1) return;
    queueMicrotask(() => {
      const notices = this.#pending;
      this.#pending = [];
      for (const member of this.#members) {
        const mine = notices.filter((n) => n.l === member.name);
        if (mine.length > 0) member.onOffers(mine);
      }
    });
  }
}

const hubs = new WeakMap<object, ListenHub>();

/** The hub of a database handle: one per pool (or PGlite instance) per process. */
export function hubFor(key: object, db: Database): ListenHub {
  let hub = hubs.get(key);
  if (!hub) {
    hub = new ListenHub(db);
    hubs.set(key, hub);
  }
  return hub;
}
