import type { Database } from '@sluice/postgres/database';
import { systemClock, type Clock, type ClockTimer } from 'sluice/concurrency';

/**
 * Admission batches of one tenant that run at once in one process (each batch takes every
 * admission of the tenant waiting when its turn comes; see admission.ts). They wait for each
 * other on the tenant's advisory lock anyway; waiting in the process instead means a burst from one tenant,
 * or a session stuck holding its lock, ties up this many pooled connections rather than the
 * whole pool, and other tenants are still served. Two, not one, so one admission's connection
 * checkout and BEGIN overlap the other's work under the lock.
 */
export const ADMISSIONS_PER_TENANT = 2;

interface Line {
  running: number;
  /** Callers waiting for a turn, first come first served. */
  waiting: (() => void)[];
  /** When an admission of the tenant last got through (or failed for a reason other than the lock). */
  movedAt: number;
}

/** Per database handle, the tenants with admissions running or waiting in this process. */
const lines = new WeakMap<Database, Map<string, Line>>();

export async function inTurn<T>(
  db: Database,
  tenant: string,
  waitMs: number,
  body: () => Promise<T>,
  clock: Clock = systemClock,
): Promise<T> {
  let tenants = lines.get(db);
  if (!tenants) lines.set(db, (tenants = new Map()));
  let line = tenants.get(tenant);
  if (!line) tenants.set(tenant, (line = { running: 0, waiting: [], movedAt: clock.now() }));
  if (line.running < ADMISSIONS_PER_TENANT) line.running++;
  else await turn(line, tenant, waitMs, clock);
  let moved = true;
  try {
    return await body();
  } catch (error) {
    if ((error as { code?: string }).code === LOCK_NOT_AVAILABLE) moved = false;
    throw error;
  } finally {
    if (moved) line.movedAt = clock.now();
    const next = line.waiting.shift();
    // The turn passes straight on, so no newcomer slips in between.
    if (next) next();
    else if (--line.running === 0) tenants.delete(tenant);
  }
}

/**
 * Waits for a turn. A long line that moves is waited out; one where nothing of the tenant got
 * through for `waitMs` is behind a stuck lock, and the caller gives up as a lock wait would.
 */
function turn(line: Line, tenant: string, waitMs: number, clock: Clock): Promise<void> {
  const since = clock.now();
  return new Promise<void>((resolve, reject) => {
    let timer: ClockTimer;
    const go = () => {
      clock.clearTimeout(timer);
      resolve();
    };
    const check = () => {
      const still = clock.now() - Math.max(since, line.movedAt);
      if (still < waitMs) {
        timer = clock.setTimeout(check, waitMs - still);
        return;
      }
      line.waiting.splice(line.waiting.indexOf(go), 1);
      reject(
        // As PostgreSQL's own lock timeout, so it is answered the same way: 503, try again.
        Object.assign(new Error(`Admissions of tenant ${tenant} made no progress for ${waitMs} ms`), {
          code: LOCK_NOT_AVAILABLE,
        }),
      );
    };
    timer = clock.setTimeout(check, waitMs);
    line.waiting.push(go);
  });
}

const LOCK_NOT_AVAILABLE = '55P03';
