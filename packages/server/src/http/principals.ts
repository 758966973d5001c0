import type { Database } from '@sluice/postgres/database';
import type { RunEvents } from '../runs/events.js';
import { findToken, hashSecret, type Principal } from '../store/tokens.js';
import { systemClock } from 'sluice/concurrency';

/** How long a looked-up token is trusted without asking the database again. */
export const PRINCIPAL_TTL_MS = 30_000;
/** Tokens remembered at most; the oldest go first. */
export const PRINCIPAL_CACHE_SIZE = 10_000;

interface Entry {
  principal: Principal;
  generation: number;
  at: number;
}

/**
 * The principals of recently seen API tokens, so that a request does not read `api_tokens`
 * (about a fifth of a refused admission's cost, measured with `bench:server`). A revocation
 * reaches every process at once through the `token:<id>` notification that `revokeToken`
 * sends; the cache is used only while notifications arrive, and what was learnt before the
 * current LISTEN session is not trusted (a revocation may have been missed in between).
 * Unknown secrets are never cached: each costs a lookup, bounded by the failed-auth limiter.
 */
export class Principals {
  readonly #db: Database;
  readonly #events: RunEvents;
  readonly #now: () => number;
  readonly #entries = new Map<string, Entry>();
  /** Revocations heard: a lookup that saw one arrive while it read is not cached. */
  #revocations = 0;

  constructor(db: Database, events: RunEvents, now: () => number = systemClock.now) {
    this.#db = db;
    this.#events = events;
    this.#now = now;
    events.on((event) => {
      if (event.kind !== 'token') return;
      this.#revocations++;
      for (const [key, entry] of this.#entries)
        if (entry.principal.tokenId === event.id) this.#entries.delete(key);
    });
  }

  /** The live token's principal, or undefined for an unknown or revoked secret. */
  async find(secret: string): Promise<Principal | undefined> {
    const key = hashSecret(secret);
    const generation = this.#events.generation;
    const revocations = this.#revocations;
    const cached = this.#entries.get(key);
    if (
      cached &&
      this.#events.listening &&
      cached.generation === generation &&
      this.#now() - cached.at < PRINCIPAL_TTL_MS
    )
      return cached.principal;
    this.#entries.delete(key);
    const principal = await findToken(this.#db, secret);
    const unchanged = this.#events.generation === generation && this.#revocations === revocations;
    if (principal && this.#events.listening && unchanged) {
      if (this.#entries.size >= PRINCIPAL_CACHE_SIZE) {
        this.#entries.delete(this.#entries.keys().next().value!);
      }
      this.#entries.set(key, { principal, generation, at: this.#now() });
    }
    return principal;
  }
}
