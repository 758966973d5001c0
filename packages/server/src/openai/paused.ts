import { HttpError } from '../http/errors.js';
import type { RunRow } from '../runs/store.js';

/**
 * A chat completion whose run paused for a person: Chat Completions has no paused state, and an
 * empty completion would read as an answer. The client raises this 409 (not retried); the run
 * goes on through the runs API (`POST /agents/runs/:id/resume`, then `GET /agents/runs/:id`).
 */
export function requiresAction(run: RunRow): HttpError {
  return new HttpError(
    409,
    'run_requires_action',
    `Run ${run.id} waits for a person (${run.required_action?.type ?? 'requires_action'}): answer it with POST /api/client/v1/agents/runs/${run.id}/resume and read its answer with GET /api/client/v1/agents/runs/${run.id}`,
    { run_id: run.id, required_action: run.required_action },
    { 'x-should-retry': 'false' },
  );
}
