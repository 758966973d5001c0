import type { Principal } from '../store/tokens.js';
import { toJsonb } from './json.js';
import type { RunStatus } from './states.js';
import { newRunId, type NewRun, type RunRow } from './store.js';

/**
 * Admitted runs as `sluice_insert_runs` takes them (sql/016_admission_fast_path.sql): one JSON
 * document per run, absent keys NULL, cut into statements of bounded size. The state a run is
 * born in is given by the caller (lifecycle.ts `bornStatus`), which owns every status a row gets.
 */

/**
 * The most JSON text one statement carries. A batch of large runs (each within the request
 * limits) would otherwise pass V8's longest string or PostgreSQL's jsonb size limit, and fail
 * every run batched with them; past this size a batch is written by several statements.
 */
export const MAX_STATEMENT_JSON_CHARS = 32 * 2 ** 20;

function runDocument(who: Principal, run: NewRun, status: RunStatus): Record<string, unknown> {
  return {
    id: run.id,
    tenant: who.tenant,
    project: who.project,
    user_id: who.user,
    agent: run.agent,
    class: run.class,
    mode: run.mode,
    status,
    input: run.input,
    metadata: run.metadata,
    worker: run.worker,
    at_ms: run.schedule && 'atMs' in run.schedule ? run.schedule.atMs : undefined,
    delay_ms: run.schedule && 'delayMs' in run.schedule ? run.schedule.delayMs : undefined,
    callback_url: run.callbackUrl,
    thread_id: run.threadId,
    config: run.config,
    api_request: run.apiRequest,
  };
}

/**
 * The batch as jsonb arrays of at most MAX_STATEMENT_JSON_CHARS each (one run larger than that
 * goes alone); the runs given an id if they have none.
 */
export function runDocuments(
  runs: { who: Principal; run: NewRun }[],
  statusOf: (run: NewRun) => RunStatus,
): { ids: string[]; chunks: string[] } {
  const ids = runs.map(({ run }) => run.id ?? newRunId());
  const chunks: string[] = [];
  let current: string[] = [];
  let size = 0;
  runs.forEach(({ who, run }, i) => {
    const json = toJsonb(runDocument(who, { ...run, id: ids[i] }, statusOf(run)))!;
    if (current.length > 0 && size + json.length > MAX_STATEMENT_JSON_CHARS) {
      chunks.push(`[${current.join(',')}]`);
      current = [];
      size = 0;
    }
    current.push(json);
    size += json.length + 1;
  });
  if (current.length > 0) chunks.push(`[${current.join(',')}]`);
  return { ids, chunks };
}

/** Rows in the order of `ids` (an insert returns them in no promised order). */
export const inOrder = (ids: string[], rows: RunRow[]): RunRow[] => {
  const byId = new Map(rows.map((row) => [row.id, row]));
  return ids.map((id) => byId.get(id)!);
};
