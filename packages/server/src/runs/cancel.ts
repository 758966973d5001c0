import type { Database } from '@sluice/postgres/database';
import type { Executor } from './executor.js';
import { cancelNotStarted, isFinal, requestCancel } from './lifecycle.js';
import { getRun, type RunRow } from './store.js';
import type { RunWaiters } from './waiters.js';

/** How long a cancel of a run executing on another process waits for that process to confirm. */
export const CANCEL_CONFIRM_MS = 5_000;

/** Who may cancel a run: a member the runs of its own project, an admin any run of its tenant. */
export const mayCancel = (who: { role: string; project: string }, run: { project: string }): boolean =>
  who.role === 'admin' || run.project === who.project;

/**
 * Cancels a run wherever it is. Not started: canceled at once. Executing here: stopped, and
 * its final row awaited. Executing on another process: that process is asked (it stops the run
 * within about a second) and the caller waits up to `confirmMs` for it to confirm; until it
 * does, the run still counts for every cap. Returns the run as it stands then.
 */
export async function cancelRun(
  deps: { db: Database; executor: Executor; waiters: RunWaiters },
  run: RunRow,
  options: { confirmMs: number; signal?: AbortSignal },
): Promise<RunRow> {
  const { db, executor, waiters } = deps;
  if (isFinal(run.status)) return run;
  const stopped = await cancelNotStarted(db, run.tenant, run.id);
  if (stopped) return stopped;
  if (executor.stop(run.id, 'cancel')) {
    return (await executor.settled(run.id)) ?? (await getRun(db, run.tenant, run.id)) ?? run;
  }
  if ((await requestCancel(db, run.tenant, run.id)) !== undefined && options.confirmMs > 0) {
    await waiters.wait(run.id, { timeoutMs: options.confirmMs, signal: options.signal });
  }
  return (await getRun(db, run.tenant, run.id)) ?? run;
}
