import { agentFor } from '../config.js';
import { HttpError, badRequest } from '../http/errors.js';
import { checkInput } from '../http/limits.js';
import type { RouteContext } from '../routes/context.js';
import type { WithRun } from '../runs/admission.js';
import { getRun, type RunRow } from '../runs/store.js';
import { submitQueued } from '../runs/submission.js';
import type { Principal } from '../store/tokens.js';
import type { TriggerRow } from './store.js';

/** Runs a trigger makes are made for the admin who created it, in their tenant and project. */
export function principalOf(trigger: TriggerRow): Principal {
  return {
    tokenId: `trigger:${trigger.id}`,
    tenant: trigger.tenant,
    project: trigger.project,
    user: trigger.user_id,
    role: 'member',
  };
}

/** The trigger's own text first (what to do), then the event (a webhook's body, a tick). */
export function inputOf(trigger: TriggerRow, event: string): string {
  if (event === '') {
    if (trigger.input) return trigger.input;
    throw badRequest('The webhook body is empty and the trigger has no `input`: the run would ask nothing', {
      field: 'body',
    });
  }
  return trigger.input ? `${trigger.input}\n\n${event}` : event;
}

/**
 * Queues one run of a trigger in its class, through the runs API's admission (its caps and
 * 429s), with `withRun` written in the same transaction. An agent taken out of the config (or
 * out of the tenant's list) since the trigger was made answers 404.
 */
export async function queueTriggerRun(
  ctx: RouteContext,
  trigger: TriggerRow,
  input: string,
  metadata: Record<string, string>,
  withRun: WithRun,
): Promise<RunRow> {
  if (!agentFor(ctx.config, trigger.tenant, trigger.agent))
    throw new HttpError(
      404,
      'not_found',
      `Trigger ${trigger.id} names agent \`${trigger.agent}\`, which is not served`,
    );
  checkInput(input, 'body');
  return submitQueued(
    ctx,
    principalOf(trigger),
    { agent: trigger.agent, class: trigger.class, input, metadata },
    { withRun },
  );
}

/** The run `id` of the trigger's tenant as it stands. */
export async function runOf(ctx: RouteContext, trigger: TriggerRow, id: string): Promise<RunRow | undefined> {
  return getRun(ctx.db, trigger.tenant, id);
}
