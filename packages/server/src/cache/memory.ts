import { BoundedMap, type BoundedMapOptions } from './bounded-map.js';
import type { PlaceTaken } from './places.js';
import type { CacheStore, WindowCount } from './store.js';

/**
 * The cache store in this process's memory, bounded to `maxKeys` (50,000) keys. Places and
 * revocations are kept keys: only counters are evicted to make room. Every count is this
 * process's own: with several server processes, each has its own caps and limiter.
 */
export class MemoryCacheStore implements CacheStore {
  readonly kind = 'memory';
  readonly map: BoundedMap;

  constructor(options: BoundedMapOptions = {}) {
    this.map = new BoundedMap(options);
  }

  async take(key: string, limit: number): Promise<PlaceTaken> {
    const name = `place:${key}`;
    const held = this.map.get(name)?.value ?? 0;
    if (limit > 0 && held >= limit) return { ok: false, held };
    // A full map of kept keys (50,000 places and revocations) cannot take one more.
    if (!this.map.set(name, held + 1, { kept: true })) return { ok: false, held };
    let released = false;
    return {
      ok: true,
      release: () => {
        if (released) return;
        released = true;
        const now = (this.map.get(name)?.value ?? 1) - 1;
        if (now <= 0) this.map.delete(name);
        else this.map.set(name, now, { kept: true });
      },
    };
  }

  async held(key: string): Promise<number> {
    return this.map.get(`place:${key}`)?.value ?? 0;
  }

  async hit(key: string, windowMs: number): Promise<WindowCount> {
    const name = `hit:${key}`;
    const current = this.map.get(name);
    if (current) {
      this.map.set(name, current.value + 1, { kept: false });
      return { count: current.value + 1, leftMs: current.leftMs };
    }
    this.map.set(name, 1, { kept: false, ttlMs: windowMs });
    return { count: 1, leftMs: windowMs };
  }

  async count(key: string): Promise<WindowCount> {
    const current = this.map.get(`hit:${key}`);
    return current ? { count: current.value, leftMs: current.leftMs } : { count: 0, leftMs: 0 };
  }

  async revoke(tokenId: string): Promise<void> {
    if (!this.map.set(`revoked:${tokenId}`, 1, { kept: true }))
      throw new Error(
        `The memory cache store is full of places and revocations; ${tokenId} was not recorded`,
      );
  }

  async isRevoked(tokenId: string): Promise<boolean> {
    return this.map.get(`revoked:${tokenId}`) !== undefined;
  }

  async close(): Promise<void> {}
}
