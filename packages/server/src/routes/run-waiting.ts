import type { RouteContext } from './context.js';
import { userRetryAfterMs } from '../runs/admission.js';
import { toApiRun, type RunRow } from '../runs/store.js';
import { readWaitingFacts, waitingOf, waits } from '../runs/waiting.js';

/**
 * Runs of one tenant as the API shows them, a queued or scheduled one with its `waiting`. The
 * facts are read once for the whole page, and only when one of its runs waits.
 */
export async function withWaiting(
  ctx: Pick<RouteContext, 'db' | 'settings' | 'limitsFor' | 'providerWaiting'>,
  tenant: string,
  runs: readonly RunRow[],
  render: (run: RunRow) => ReturnType<typeof toApiRun> = toApiRun,
) {
  if (!runs.some(waits)) return runs.map(render);
  const facts = await readWaitingFacts(ctx.db, tenant, runs, {
    limits: ctx.limitsFor(tenant),
    deferredRunningCap: ctx.settings.deferredMaxRunningPerTenant,
    providerWaiting: (agent) => ctx.providerWaiting?.(tenant, agent) ?? false,
    capWaitMs: userRetryAfterMs(ctx.db, tenant),
  });
  return runs.map((run) => {
    const waiting = waitingOf(run, facts);
    return waiting === undefined ? render(run) : { ...render(run), waiting };
  });
}
