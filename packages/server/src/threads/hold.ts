import type { Database } from '@sluice/postgres/database';
import { cancelRun, mayCancel } from '../runs/cancel.js';
import type { Executor } from '../runs/executor.js';
import { getRun } from '../runs/store.js';
import type { RunWaiters } from '../runs/waiters.js';
import { lockThread, type LockAttempt } from './store.js';

export type OnBusy = 'wait' | 'cancel';

/** How often a waiting caller tries the thread again when no notification came. */
const RETRY_MS = 1_000;

/**
 * Takes a thread for a held run that is about to be admitted under `runId`, waiting while
 * another run holds it, at most `waitMs`. With `onBusy: 'cancel'` the holder is asked to stop
 * first, and asked again every second while the caller waits (a run that had not started yet
 * when first asked, or a run that took the thread meanwhile, is stopped too).
 */
export async function holdThread(
  deps: { db: Database; executor: Executor; waiters: RunWaiters },
  request: {
    thread: { id: string; tenant: string };
    runId: string;
    /** Who asks: `onBusy: 'cancel'` keeps to the cancel rule (see `mayCancel`). */
    who: { project: string; role: string };
    onBusy: OnBusy;
    waitMs: number;
    leaseMs: number;
    signal?: AbortSignal;
  },
): Promise<LockAttempt> {
  const { db, waiters } = deps;
  const deadline = Date.now() + request.waitMs;
  let askedAt = Number.NEGATIVE_INFINITY;
  for (;;) {
    const attempt = await lockThread(db, request.thread, request.runId, request.leaseMs);
    if (attempt.ok || !('activeRunId' in attempt)) return attempt;
    if (request.onBusy === 'cancel' && attempt.activeRunId !== null && Date.now() - askedAt >= RETRY_MS) {
      // Asked before the deadline is looked at: even with no time to wait, the holder is stopped
      // (a local one has ended when this returns), and the thread is tried again at once.
      askedAt = Date.now();
      const active = await getRun(db, request.thread.tenant, attempt.activeRunId);
      if (active && !mayCancel(request.who, active)) {
        return { ok: false, forbidden: active.id };
      }
      if (active) {
        await cancelRun(deps, active, { confirmMs: 0 });
        continue;
      }
    }
    const left = deadline - Date.now();
    if (left <= 0 || request.signal?.aborted) return attempt;
    const waited = await waiters.waitForThread(request.thread.id, {
      timeoutMs: Math.min(left, RETRY_MS),
      signal: request.signal,
    });
    // Draining: no more waiting (and no spinning on a wait that returns at once).
    if (waited === 'closed') return { ok: false, closed: true };
  }
}
