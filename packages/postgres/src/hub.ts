import { randomBytes } from 'node:crypto';
import type { Database, ListenSession } from './database.js';

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
 */
export class ListenHub {
  readonly owner = randomBytes(6).toString('hex');
  readonly channel = `${channelPrefix}${this.owner}`;
  listening = false;

  readonly #members = new Set<HubMember>();
  #session: ListenSession | undefined;
  #connecting: Promise<void> | undefined;
  #retryTimer: ReturnType<typeof setTimeout> | undefined;
  #backoffMs = 100;
  #pending: OfferNotice[] = [];
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
    clearTimeout(this.#retryTimer);
    this.#retryTimer = undefined;
    await this.#connecting?.catch(() => undefined);
    const session = this.#session;
    this.#session = undefined;
    this.#setListening(false);
    await session?.close();
  }

  /** Starts listening if it is not already; resolves once connected or failed. */
  ensureListening(): Promise<void> {
    if (this.#closed || !this.db.listen || this.#session || this.#retryTimer)
      return this.#connecting ?? Promise.resolve();
    this.#connecting ??= this.#connect().finally(() => (this.#connecting = undefined));
    return this.#connecting;
  }

  async #connect(): Promise<void> {
    try {
      const session = await this.db.listen!(
        this.channel,
        (payload) => this.#onNotify(payload),
        () => this.#onLost(),
      );
      if (this.#closed) {
        await session.close();
        return;
      }
      this.#session = session;
      this.#backoffMs = 100;
      this.#setListening(true);
    } catch {
      this.#scheduleReconnect();
    }
  }

  #onLost(): void {
    this.#session = undefined;
    this.#setListening(false);
    this.#scheduleReconnect();
  }

  #scheduleReconnect(): void {
    if (this.#closed || this.#retryTimer) return;
    const delay = this.#backoffMs;
    this.#backoffMs = Math.min(this.#backoffMs * 2, 5_000);
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
    let notice: OfferNotice;
    try {
      notice = JSON.parse(payload) as OfferNotice;
    } catch {
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
