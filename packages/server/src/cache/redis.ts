import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { CacheUnavailableError } from './errors.js';
import type { PlaceTaken } from './places.js';
import type { CacheStore, WindowCount } from './store.js';

/**
 * Each place is a member of a sorted set scored by the expiry of its lease, in Redis time (one
 * clock for every server process). Expired members are dropped before counting, so a process
 * that died without releasing its places gives them back when their leases run out. The set
 * itself expires with its newest lease, so an abandoned key leaves nothing behind.
 */
const TAKE = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZCARD', KEYS[1])
local limit = tonumber(ARGV[1])
if limit > 0 and held >= limit then return {0, held} end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, held + 1}`;

const HELD = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')`;

/** Renews the leases still there (XX: a lease that already ran out is not brought back). */
const RENEW = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local renewed = 0
for i = 2, #ARGV do
  renewed = renewed + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[1]), ARGV[i])
end
if renewed > 0 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return renewed`;

/**
 * Puts back places this process still holds into a Redis that restarted empty (NX: a place
 * that is there is left as it is). No limit is asked: the runs holding them are running.
 */
const RECLAIM = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local added = 0
for i = 2, #ARGV do
  added = added + redis.call('ZADD', KEYS[1], 'NX', now + tonumber(ARGV[1]), ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return added`;

const HIT = `
local n = redis.call('INCR', KEYS[1])
local left = redis.call('PTTL', KEYS[1])
if n == 1 or left < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  left = tonumber(ARGV[1])
end
return {n, left}`;

const COUNT = `
local n = redis.call('GET', KEYS[1])
if not n then return {0, 0} end
local left = redis.call('PTTL', KEYS[1])
if left < 0 then left = 0 end
return {tonumber(n), left}`;

type Commands = {
  sluiceCount(key: string): Promise<[number, number]>;
  sluiceTake(key: string, limit: number, leaseMs: number, member: string): Promise<[number, number]>;
  sluiceHeld(key: string): Promise<number>;
  sluiceRenew(key: string, leaseMs: number, ...members: string[]): Promise<number>;
  sluiceReclaim(key: string, leaseMs: number, ...members: string[]): Promise<number>;
  sluiceHit(key: string, windowMs: number): Promise<[number, number]>;
};

export interface RedisCacheStoreOptions {
  url: string;
  /**
   * How long a place outlives its last renewal; renewed every quarter of it while held.
   * @default 60_000
   */
  leaseMs?: number;
  /**
   * How long a command may wait for Redis's answer before it fails (a request then gets 503).
   * Without it, a connection that goes silent without a reset would hold every request that
   * counts a place or a failed authentication, and `close`, forever.
   * @default 5_000
   */
  commandTimeoutMs?: number;
  /** @default 'sluice:' */
  prefix?: string;
  /** Connection trouble, reported at most once per outage. */
  warn?: (message: string, fields: object) => void;
}

/** The cache store in Redis: every count and revocation is shared by all server processes. */
export class RedisCacheStore implements CacheStore {
  readonly kind = 'redis';
  readonly leaseMs: number;
  readonly #redis: Redis & Commands;
  /** The places this process holds, by key: renewed until released. */
  readonly #held = new Map<string, Set<string>>();
  #renewal: ReturnType<typeof setInterval> | undefined;
  /** The renewal under way, if any: a second caller waits for it instead of sending another. */
  #renewing: Promise<void> | undefined;
  /** Releases sent and not yet answered: `renewNow` and `close` wait for them. */
  readonly #releasing = new Set<Promise<unknown>>();
  /** The `run_id` of the Redis server last connected to: a new one is a restart. */
  #serverRun: string | undefined;
  /** The reclaim under way after a restart, if any (`reclaimed` waits for it). */
  #reclaiming: Promise<void> | undefined;
  /** The restarted server whose reclaim has not gone through yet (tried again at each renewal). */
  #owed: string | undefined;
  /** The last reconnect could not read the server's `run_id`: the next renewal asks again. */
  #runUnchecked = false;

  private constructor(redis: Redis, leaseMs: number) {
    this.#redis = redis as Redis & Commands;
    this.leaseMs = leaseMs;
    redis.defineCommand('sluiceTake', { numberOfKeys: 1, lua: TAKE });
    redis.defineCommand('sluiceHeld', { numberOfKeys: 1, lua: HELD });
    redis.defineCommand('sluiceRenew', { numberOfKeys: 1, lua: RENEW });
    redis.defineCommand('sluiceReclaim', { numberOfKeys: 1, lua: RECLAIM });
    redis.defineCommand('sluiceHit', { numberOfKeys: 1, lua: HIT });
    redis.defineCommand('sluiceCount', { numberOfKeys: 1, lua: COUNT });
  }

  /** Connects and checks that Redis answers; throws naming the URL's host when it does not. */
  static async open(options: RedisCacheStoreOptions): Promise<RedisCacheStore> {
    const leaseMs = options.leaseMs ?? 60_000;
    if (!Number.isSafeInteger(leaseMs) || leaseMs < 100)
      throw new RangeError(`Expected \`leaseMs\` to be a whole number of at least 100, got \`${leaseMs}\``);
    const redis = new Redis(options.url, {
      keyPrefix: options.prefix ?? 'sluice:',
      lazyConnect: true,
      // A request waits for a reconnect once at most, then fails instead of hanging.
      maxRetriesPerRequest: 1,
      connectTimeout: 5_000,
      commandTimeout: options.commandTimeoutMs ?? 5_000,
      // A command its caller was already told failed (503) is not sent again on reconnect: a
      // take replayed then would hold a place nobody releases until its lease runs out.
      autoResendUnfulfilledCommands: false,
    });
    let down = false;
    redis.on('error', (error: Error) => {
      if (down) return;
      down = true;
      options.warn?.('redis cache store unreachable', { error: error.message });
    });
    redis.on('ready', () => (down = false));
    try {
      await redis.connect();
      await redis.ping();
    } catch (error) {
      redis.disconnect();
      const where = safeUrl(options.url);
      throw new Error(`The Redis cache store at ${where} (REDIS_URL) does not answer: ${String(error)}`, {
        cause: error,
      });
    }
    const store = new RedisCacheStore(redis, leaseMs);
    store.#serverRun = await serverRunOf(redis).catch(() => undefined);
    store.#runUnchecked = store.#serverRun === undefined;
    redis.on('ready', () => void store.#afterReconnect());
    // The timer skips a tick while a renewal is still under way (Redis slow or away) rather than
    // queueing one more behind it for every tick.
    store.#renewal = setInterval(
      () => void (store.#renewing ?? store.renewNow()),
      Math.max(25, Math.floor(leaseMs / 4)),
    );
    store.#renewal.unref();
    return store;
  }

  async take(key: string, limit: number): Promise<PlaceTaken> {
    const member = randomBytes(9).toString('base64url');
    const [ok, held] = await this.#answer(
      this.#redis.sluiceTake(`place:${key}`, limit, this.leaseMs, member),
    );
    if (ok !== 1) return { ok: false, held };
    let members = this.#held.get(key);
    if (!members) this.#held.set(key, (members = new Set()));
    members.add(member);
    let released = false;
    return {
      ok: true,
      release: () => {
        if (released) return;
        released = true;
        const mine = this.#held.get(key);
        mine?.delete(member);
        if (mine?.size === 0) this.#held.delete(key);
        // Not awaited by the caller; should it fail, the lease runs out instead.
        const sent = this.#redis.zrem(`place:${key}`, member).catch(() => 0);
        this.#releasing.add(sent);
        void sent.then(() => this.#releasing.delete(sent));
      },
    };
  }

  async held(key: string): Promise<number> {
    return this.#answer(this.#redis.sluiceHeld(`place:${key}`));
  }

  /**
   * Renews the leases of every place this process holds (also done on a timer). When it
   * resolves, every release made before the call has reached Redis, so a count read on any
   * connection afterwards no longer includes it.
   */
  async renewNow(): Promise<void> {
    const releases = [...this.#releasing];
    while (this.#renewing) await this.#renewing;
    // `#renewing` covers the releases too and is cleared before it resolves: a waiter woken by
    // it must never find it still set (a settled promise awaited in a loop spins on microtasks,
    // and the process then never reads the release's answer nor anything else again).
    const renewing: Promise<void> = (this.#renewing = Promise.all([this.#renewAll(), ...releases])
      .then(() => undefined)
      .finally(() => {
        if (this.#renewing === renewing) this.#renewing = undefined;
      }));
    await renewing;
  }

  /**
   * A reconnect to a Redis that restarted (its `run_id` changed) finds the places empty when it
   * kept nothing on disk: this process's places are put back at once, so that the users'
   * runs still held here count again. Between the restart and this, takes elsewhere may have
   * gone past a cap by as many as came in that gap; without it, every place held across the
   * restart would go uncounted until its run ended. A reconnect to the same server (a network
   * blip) changes nothing: renewals go on, and a lease that ran out meanwhile stays out.
   */
  async #afterReconnect(): Promise<void> {
    const run = await serverRunOf(this.#redis).catch(() => undefined);
    // Not known now: the next renewal asks again.
    this.#runUnchecked = run === undefined;
    if (run === undefined || run === this.#serverRun) return;
    // A server never seen before this store's first look is not a restart it can tell apart
    // from a blip: nothing is brought back (a lease that ran out stays out).
    if (this.#serverRun !== undefined) this.#owed = run;
    this.#serverRun = run;
    await this.#reclaimOwed();
  }

  /** Puts the places back after a restart; one that fails is tried again at the next renewal. */
  async #reclaimOwed(): Promise<void> {
    if (this.#reclaiming) return this.#reclaiming;
    const owed = this.#owed;
    if (owed === undefined) return;
    const reclaiming = (this.#reclaiming = Promise.all(
      [...this.#held].map(([key, members]) =>
        this.#redis.sluiceReclaim(`place:${key}`, this.leaseMs, ...members),
      ),
    ).then(
      () => {
        if (this.#owed === owed) this.#owed = undefined;
      },
      () => undefined,
    ));
    await reclaiming;
    if (this.#reclaiming === reclaiming) this.#reclaiming = undefined;
  }

  /** The reclaim after a restart, when one is under way. */
  async reclaimed(): Promise<void> {
    await this.#reclaiming;
  }

  async #renewAll(): Promise<void> {
    if (this.#runUnchecked) await this.#afterReconnect();
    else await this.#reclaimOwed();
    await Promise.all(
      [...this.#held].map(([key, members]) =>
        this.#redis.sluiceRenew(`place:${key}`, this.leaseMs, ...members).catch(() => 0),
      ),
    );
  }

  async hit(key: string, windowMs: number): Promise<WindowCount> {
    const [count, leftMs] = await this.#answer(this.#redis.sluiceHit(`hit:${key}`, windowMs));
    return { count, leftMs };
  }

  async count(key: string): Promise<WindowCount> {
    const [count, leftMs] = await this.#answer(this.#redis.sluiceCount(`hit:${key}`));
    return { count, leftMs };
  }

  async revoke(tokenId: string): Promise<void> {
    await this.#redis.set(`revoked:${tokenId}`, '1');
  }

  async isRevoked(tokenId: string): Promise<boolean> {
    return (await this.#answer(this.#redis.exists(`revoked:${tokenId}`))) === 1;
  }

  /**
   * A request that needs Redis while it is away gets 503 with Retry-After, as one that needs the
   * database does: the caps cannot be checked, so nothing is admitted unchecked. A command that
   * timed out means a connection that no longer answers: it is dropped and opened again.
   */
  async #answer<T>(pending: Promise<T>): Promise<T> {
    try {
      return await pending;
    } catch (error) {
      if (error instanceof Error && /timed out/i.test(error.message) && this.#redis.status === 'ready')
        this.#redis.disconnect(true);
      throw new CacheUnavailableError(error);
    }
  }

  async close(): Promise<void> {
    clearInterval(this.#renewal);
    const held = [...this.#held];
    this.#held.clear();
    await Promise.all([
      ...this.#releasing,
      ...held.map(([key, members]) => this.#redis.zrem(`place:${key}`, ...members).catch(() => 0)),
    ]);
    await this.#redis.quit().catch(() => this.#redis.disconnect());
  }
}

/** The `run_id` of the Redis server on the other end: a new one each time it starts. */
async function serverRunOf(redis: Redis): Promise<string | undefined> {
  const info = await redis.info('server');
  return /^run_id:(\w+)/m.exec(info)?.[1];
}

/** The URL without its password, for messages. */
function safeUrl(raw: string): string {
  try {
    const url = new URL(raw);
    if (url.password) url.password = '***';
    return url.toString();
  } catch {
    return '(an unparsable URL)';
  }
}
