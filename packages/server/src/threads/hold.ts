import type { Database } from '@sluice/postgres/database';
import { systemClock, type Clock } from 'sluice/concurrency';
import { cancelRun, mayCancel } from '../runs/cancel.js';
import type { Executor } from '../runs/executor.js';
import { getRun } from '../runs/store.js';
import { RunRefusedError } from '../runs/refused.js';
import type { RunWaiters } from '../runs/waiters.js';
import { tuning } from '../tuning.js';
import { getThread, lockThread, type LockAttempt } from './store.js';

export type OnBusy = 'wait' | 'cancel';

/** A thread's attempt, or: its run waits for a person (named), so waiting for it is pointless. */
export type HoldAttempt = LockAttempt | { ok: false; requiresAction: string };

/** The refusal of a new run on a thread whose run waits in requires_action. */
export const threadRequiresAction = (threadId: string, runId: string) =>
  new RunRefusedError({ kind: 'thread_requires_action', threadId, runId });

const RETRY_MS = tuning.threadRetryMs;

/**
 * Takes a thread for a held run that is about to be admitted under `runId`, waiting while
 * another run holds it, at most `waitMs`. With `onBusy: 'cancel'` the holder is asked to stop
 * first, and asked again every second while the caller waits (a run that had not started yet
 * when first asked, or a run that took the thread meanwhile, is stopped too). A holder paused
 * in requires_action may wait for hours: without `'cancel'` the caller is told at once.
 */
export async function holdThread(
  deps: { db: Database; executor: Executor; waiters: RunWaiters; clock?: Clock },
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
): Promise<HoldAttempt> {
  const { db, waiters } = deps;
  const clock = deps.clock ?? systemClock;
  const deadline = clock.now() + request.waitMs;
  let askedAt = Number.NEGATIVE_INFINITY;
  for (;;) {
    const attempt = await lockThread(db, request.thread, request.runId, request.leaseMs);
    if (attempt.ok || !('activeRunId' in attempt)) return attempt;
    if (request.onBusy !== 'cancel' && attempt.activeRunId !== null) {
      const active = await getRun(db, request.thread.tenant, attempt.activeRunId);
      if (active?.status === 'requires_action') return { ok: false, requiresAction: active.id };
    }
    if (request.onBusy === 'cancel' && attempt.activeRunId !== null && clock.now() - askedAt >= RETRY_MS) {
      // Asked before the deadline is looked at: even with no time to wait, the holder is stopped
      // (a local one has ended when this returns), and the thread is tried again at once.
      askedAt = clock.now();
      const active = await getRun(db, request.thread.tenant, attempt.activeRunId);
      if (active && !mayCancel(request.who, active)) {
        return { ok: false, forbidden: active.id };
      }
      if (active) {
        await cancelRun(deps, active, { confirmMs: 0 });
        continue;
      }
    }
    const left = deadline - clock.now();
    if (left <= 0 || request.signal?.aborted) return attempt;
    const waited = await waiters.waitForThread(request.thread.id, {
      timeoutMs: Math.min(left, RETRY_MS),
      signal: request.signal,
    });
    // Draining: no more waiting (and no spinning on a wait that returns at once).
    if (waited === 'closed') return { ok: false, closed: true };
  }
}

/**
 * For a run that is queued on a thread rather than held for it: a thread whose run waits for a
 * person refuses it at once (it would wait behind the pause), unless `onBusy` is `'cancel'`,
 * which cancels the paused run first (under the cancel rule).
 */
export async function clearPausedThread(
  deps: { db: Database; executor: Executor; waiters: RunWaiters },
  request: { thread: { id: string; tenant: string }; who: { project: string; role: string }; onBusy: OnBusy },
): Promise<void> {
  const thread = await getThread(deps.db, request.thread.tenant, request.thread.id);
  if (thread?.status !== 'requires_action' || thread.active_run_id === null) return;
  if (request.onBusy !== 'cancel') throw threadRequiresAction(thread.id, thread.active_run_id);
  const active = await getRun(deps.db, request.thread.tenant, thread.active_run_id);
  if (!active) return;
  if (!mayCancel(request.who, active)) {
    throw new RunRefusedError({
      kind: 'thread_forbidden',
      threadId: thread.id,
      activeRunId: active.id,
      paused: true,
    });
  }
  await cancelRun(deps, active, { confirmMs: 0 });
}
