/**
 * Places under a key, at most `limit` held at once: the held runs of one user (the per-user
 * cap) and the open WebSocket connections of one user or of the whole server. The cache store
 * keeps them: in this process's memory, or in Redis so that every server process shares them.
 */
export type PlaceTaken = { ok: true; release: () => void } | { ok: false; held: number };

export interface Places {
  /** Takes a place under `key` unless `limit` are held (0: no cap). Release is idempotent. */
  take(key: string, limit: number): Promise<PlaceTaken>;
  /** Places held under `key` now. */
  held(key: string): Promise<number>;
}

/** The keys of the places, one spelling for every caller. */
export const placeKeys = {
  heldRuns: (tenant: string, user: string) => `held:${tenant}\u0000${user}`,
  wsUser: (tenant: string, user: string) => `ws:${tenant}\u0000${user}`,
  wsAll: () => 'ws:*',
};

/** Places in this process only: a crash frees every place it held. */
export class MemoryPlaces implements Places {
  readonly #counts = new Map<string, number>();

  async take(key: string, limit: number): Promise<PlaceTaken> {
    const held = this.#counts.get(key) ?? 0;
    if (limit > 0 && held >= limit) return { ok: false, held };
    this.#counts.set(key, held + 1);
    let released = false;
    return {
      ok: true,
      release: () => {
        if (released) return;
        released = true;
        const now = (this.#counts.get(key) ?? 1) - 1;
        if (now <= 0) this.#counts.delete(key);
        else this.#counts.set(key, now);
      },
    };
  }

  async held(key: string): Promise<number> {
    return this.#counts.get(key) ?? 0;
  }
}
