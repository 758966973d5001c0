import { HttpError } from '../http/errors.js';
import type { RunRow } from '../runs/store.js';

/** Whether a run ended because its server stopped before it finished (a SIGTERM drain ran out of time). */
export const wasInterrupted = (run: RunRow): boolean =>
  run.status === 'failed' && run.error?.type === 'interrupted';

/**
 * The answer to a caller that waited on a run its server interrupted: 503
 * `agent_run_interrupted`, as the runs API answers, in the error shape the OpenAI clients read.
 * Nothing was answered, so the client may send the request again (to a server that is not
 * stopping): no `x-should-retry: false` here, unlike a run that failed.
 */
export function interrupted(run: RunRow): HttpError {
  return new HttpError(
    503,
    'agent_run_interrupted',
    `Run ${run.id} was interrupted by a server shutdown; send the request again`,
    { run_id: run.id },
  );
}
