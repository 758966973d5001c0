import type { Database } from '@sluice/postgres/database';
import type { ServerSettings } from '../settings.js';
import { isSettled } from './lifecycle.js';
import { getRun, type RunRow } from './store.js';
import type { RunWaiters } from './waiters.js';

/** Where a run stands when its waiting caller is answered. */
export type Waited =
  /** It ended, or it waits for a person. */
  | { kind: 'settled'; run: RunRow }
  /** The window passed first: it goes on. */
  | { kind: 'pending'; run: RunRow }
  /** This process began draining meanwhile: the run goes on elsewhere. */
  | { kind: 'draining'; run: RunRow };

/** A run as its caller is answered: settled, or still going. */
export const waited = (run: RunRow): Waited => ({ kind: isSettled(run.status) ? 'settled' : 'pending', run });

/**
 * Holds a caller until a queued run settles, at most the sync window; the run as it stands
 * then. For a run that is queued already (a resumed one).
 */
export async function waitForRun(
  deps: { db: Database; waiters: RunWaiters; settings: Pick<ServerSettings, 'syncTimeoutMs'> },
  run: RunRow,
  signal: AbortSignal,
  windowMs = deps.settings.syncTimeoutMs,
): Promise<Waited> {
  const until = performance.now() + windowMs;
  const left = () => Math.max(0, until - performance.now());
  let heard = deps.waiters.wait(run.id, { timeoutMs: windowMs, signal });
  for (;;) {
    const result = await heard;
    // An end heard for an earlier stop of this run (the pause a resume answered, heard late on
    // a loaded server) does not end the wait: only the row says the run settled. The next wait
    // is in place before the row is read, so an end that comes meanwhile is not missed.
    const next = result === 'ended' && left() > 0 ? new AbortController() : undefined;
    if (next)
      heard = deps.waiters.wait(run.id, {
        timeoutMs: left(),
        signal: AbortSignal.any([signal, next.signal]),
      });
    let current: RunRow;
    try {
      current = (await getRun(deps.db, run.tenant, run.id)) ?? run;
    } catch (error) {
      next?.abort();
      throw error;
    }
    if (result === 'closed') return { kind: 'draining', run: current };
    if (next && !isSettled(current.status)) continue;
    next?.abort();
    return waited(current);
  }
}
