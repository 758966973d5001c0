import { randomFillSync } from 'node:crypto';

/**
 * Random ids for rows (runs, threads), from a pool of random bytes filled a few kilobytes at a
 * time, as Node's own `randomUUID` does. One `randomBytes` call per id was 22 µs of the ~300
 * µs a refused request cost on this project's test machines (a VM where each call is a
 * system call); from the pool an id costs well under a microsecond. The bytes are the same
 * CSPRNG output either way. Not for secrets: those take fresh bytes (see store/tokens.ts).
 */
const POOL_BYTES = 4096;
const pool = Buffer.alloc(POOL_BYTES);
let used = POOL_BYTES;

/** `prefix` and `bytes` random bytes as hex, e.g. `randomId('run_', 12)`: run_ and 24 hex digits. */
export function randomId(prefix: string, bytes: number): string {
  if (used + bytes > POOL_BYTES) {
    randomFillSync(pool);
    used = 0;
  }
  const id = prefix + pool.toString('hex', used, used + bytes);
  used += bytes;
  return id;
}
