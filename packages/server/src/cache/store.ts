import type { Places } from './places.js';

/** Which cache store a server uses: this process's memory, or a Redis every process shares. */
export type CacheStoreKind = 'memory' | 'redis';

/** A count in a window that starts with its first hit: how many so far and the ms the window has left. */
export interface WindowCount {
  count: number;
  leftMs: number;
}

/**
 * The short-lived shared state of the servers: places (per-user held runs, WebSocket
 * connections), token revocations and the failed-authentication counters. Places and
 * revocations are never evicted to make room; counters may be.
 */
export interface CacheStore extends Places {
  readonly kind: CacheStoreKind;
  /** Counts one hit of `key` in a window of `windowMs` that starts with its first hit. */
  hit(key: string, windowMs: number): Promise<WindowCount>;
  /** The count of `key` in its current window, without a hit (0 when none). */
  count(key: string): Promise<WindowCount>;
  /** Records that a token is revoked; kept until the store is emptied. */
  revoke(tokenId: string): Promise<void>;
  isRevoked(tokenId: string): Promise<boolean>;
  /** Gives back what this process holds and closes the connection. */
  close(): Promise<void>;
}
