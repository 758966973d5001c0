import type { Refusal } from '../runs/admission.js';
import { RETRY_AFTER_UNKNOWN_MS, retryAfterSeconds } from '../runs/retry-after.js';
import { CacheUnavailableError } from '../cache/errors.js';
import { AdmissionOutcomeUnknown } from '../runs/admission-settle.js';
import { RunRefusedError, refusalCode, type RunRefusal } from '../runs/refused.js';
import { shown } from '../shown.js';
import { rateLimitFields } from './rate-limit-fields.js';

export { shown };

/**
 * An error that becomes an HTTP response. Every error body has one shape,
 * `{ error: { type, code, message, param, ...details } }`: `code` repeats `type` and `param`
 * names the offending field (or is null), which is what the official OpenAI clients read.
 */
export class HttpError extends Error {
  readonly status: number;
  readonly type: string;
  readonly details: Record<string, unknown>;
  readonly headers: Record<string, string>;

  constructor(
    status: number,
    type: string,
    message: string,
    details: Record<string, unknown> = {},
    headers: Record<string, string> = {},
  ) {
    // An answer to a client, not a fault: no stack is taken (a stack was a tenth of the cost of
    // a refused request, and every 429 and 4xx makes one of these).
    const limit = Error.stackTraceLimit;
    Error.stackTraceLimit = 0;
    super(message);
    Error.stackTraceLimit = limit;
    this.status = status;
    this.type = type;
    this.details = details;
    this.headers = headers;
  }

  body() {
    const field = this.details.field;
    return {
      error: {
        type: this.type,
        code: this.type,
        message: this.message,
        param: typeof field === 'string' ? field : null,
        ...this.details,
      },
    };
  }
}

export const badRequest = (message: string, details: Record<string, unknown> = {}) =>
  new HttpError(400, 'invalid_request', message, details);
export const notFound = (message: string) => new HttpError(404, 'not_found', message);
export const forbidden = (message: string) => new HttpError(403, 'permission_denied', message);
export const draining = () =>
  new HttpError(
    503,
    'server_draining',
    'This server is shutting down; send the request to another one',
    {},
    {
      'retry-after': '1',
    },
  );

/** A used-up quota frees by the clock, not as runs end: a fixed wait. */
const QUOTA_RETRY_AFTER_S = 60;

/** The 429 of each admission refusal. */
export function refusalError(refusal: Refusal): HttpError {
  switch (refusal.kind) {
    case 'concurrency': {
      // A cap that frees as runs move on: the wait estimated from the tenant's runs (see
      // runs/retry-after.ts), in the header (whole seconds) and the body (milliseconds).
      const retryAfterMs = refusal.retryAfterMs ?? RETRY_AFTER_UNKNOWN_MS;
      const what = {
        max_active_runs: 'active default-class runs',
        max_queued_runs: 'queued or scheduled deferred runs',
        max_scheduled_runs: 'scheduled default-class runs',
        max_concurrent_per_user: 'held runs (inline or streamed)',
      }[refusal.limit];
      return new HttpError(
        429,
        'agent_run_concurrency_limit',
        `The ${refusal.scope} already has ${refusal.active} ${what}; the limit is ${refusal.limitValue}`,
        {
          limit: refusal.limit,
          limit_value: refusal.limitValue,
          scope: refusal.scope,
          class: refusal.class,
          active: refusal.active,
          retry_after_ms: retryAfterMs,
        },
        {
          'retry-after': String(retryAfterSeconds(retryAfterMs)),
          ...rateLimitFields(refusal.limit, {
            limit: refusal.limitValue,
            remaining: refusal.limitValue - refusal.active,
            seconds: retryAfterSeconds(retryAfterMs),
          }),
        },
      );
    }
    case 'quota':
      return new HttpError(
        429,
        'agent_quota_exceeded',
        `The tenant's agent-run quota is used up: ${refusal.used} of ${refusal.limitValue} runs in the period`,
        {
          limit: 'agent_runs',
          limit_value: refusal.limitValue,
          scope: 'tenant',
          class: refusal.class,
          used: refusal.used,
        },
        {
          'retry-after': String(QUOTA_RETRY_AFTER_S),
          ...rateLimitFields('agent_runs', {
            limit: refusal.limitValue,
            remaining: refusal.limitValue - refusal.used,
            seconds: QUOTA_RETRY_AFTER_S,
          }),
        },
      );
    case 'spend':
      // Not a case for retrying soon: no Retry-After, and clients that retry on their own (the
      // OpenAI ones) are told not to.
      return new HttpError(
        429,
        'spend_limit_exceeded',
        `The tenant's spend limit is used up: $${refusal.spentUsd.toFixed(4)} spent and $${refusal.reservedUsd.toFixed(4)} ` +
          `reserved for active runs, of $${refusal.limitUsd} in the period`,
        {
          limit: 'spend_usd',
          limit_value: refusal.limitUsd,
          scope: 'tenant',
          class: refusal.class,
          spent_usd: refusal.spentUsd,
          reserved_usd: refusal.reservedUsd,
        },
        {
          'x-should-retry': 'false',
          // Whole dollars are what a policy's q can say; the body has the exact figures.
          ...rateLimitFields('spend_usd', {
            limit: refusal.limitUsd,
            remaining: 0,
            seconds: QUOTA_RETRY_AFTER_S,
          }),
        },
      );
    case 'thread':
      return new HttpError(
        409,
        'thread_busy',
        `Thread ${refusal.threadId} was taken by another run while this one was being admitted`,
        { thread_id: refusal.threadId, active_run_id: null },
      );
    default: {
      const never: never = refusal;
      throw new Error(`unknown refusal ${JSON.stringify(never)}`);
    }
  }
}

/**
 * The answer to each refusal of the run domain (runs/refused.ts): admission's 429s above, the
 * thread's 404, 409 and 403, a 400 for input the run cannot take, 503 while draining.
 */
export function runRefusalError(refusal: RunRefusal): HttpError {
  const type = refusalCode(refusal);
  switch (refusal.kind) {
    case 'concurrency':
    case 'quota':
    case 'spend':
    case 'thread':
      return refusalError(refusal);
    case 'invalid_input': {
      const { field, message, limitValue, pending, missing } = refusal;
      return badRequest(message, {
        field,
        ...(limitValue === undefined ? {} : { limit_value: limitValue }),
        ...(pending === undefined ? {} : { pending }),
        ...(missing === undefined ? {} : { missing }),
      });
    }
    case 'thread_missing':
      return notFound(`No thread \`${shown(refusal.threadId)}\``);
    case 'file_missing':
      return new HttpError(404, type, `No file \`${shown(refusal.fileId)}\``, { field: refusal.field });
    case 'thread_busy':
      return new HttpError(
        409,
        type,
        `Thread ${refusal.threadId} is busy with another run; it stayed busy for ${refusal.waitedMs} ms`,
        { thread_id: refusal.threadId, active_run_id: refusal.activeRunId },
      );
    case 'thread_requires_action':
      return new HttpError(
        409,
        type,
        `Thread ${refusal.threadId} waits for a person (approvals or answers) on run ${refusal.runId}: resume that run, or send \`on_busy: "cancel"\` to cancel it`,
        { thread_id: refusal.threadId, active_run_id: refusal.runId },
      );
    case 'thread_forbidden': {
      const how = refusal.paused ? 'waits on' : 'is busy with';
      return new HttpError(
        403,
        type,
        `Thread ${refusal.threadId} ${how} run ${refusal.activeRunId} of another project; \`on_busy: "cancel"\` needs an admin token to cancel it`,
        { thread_id: refusal.threadId, active_run_id: refusal.activeRunId },
      );
    }
    case 'draining':
      return draining();
    default: {
      const never: never = refusal;
      throw new Error(`unknown refusal ${JSON.stringify(never)}`);
    }
  }
}

/**
 * The HTTP answer of an error that is an answer to the client (a refusal of any layer), or
 * undefined for anything else (a fault, an unreachable database). Every front (the error
 * handler, WebSocket frames, webhooks and ticks) tells the two apart with this.
 */
export function refusalOf(error: unknown): HttpError | undefined {
  if (error instanceof HttpError) return error;
  if (error instanceof RunRefusedError) return runRefusalError(error.refusal);
  if (error instanceof AdmissionOutcomeUnknown) {
    // Not a plain "try again": the runs may exist, and a retry would make them twice.
    return new HttpError(
      503,
      'admission_outcome_unknown',
      'The database stopped answering while the run was being created; it may exist: look it up by its id before trying again',
      { run_ids: error.ids },
      { 'retry-after': '5' },
    );
  }
  if (error instanceof CacheUnavailableError) {
    return new HttpError(
      503,
      error.code,
      error.message,
      {},
      { 'retry-after': String(Math.ceil(error.retryAfterMs / 1000)) },
    );
  }
  return undefined;
}

/** Errors that mean the database cannot be reached or answered too slowly: 503, try again. */
export function isStoreUnavailable(error: unknown): boolean {
  const e = error as { code?: string; message?: string; name?: string };
  // An admission whose answer was lost while the database could not be asked (runs/admission-settle.ts).
  if (e?.name === 'AdmissionOutcomeUnknown') return true;
  if (typeof e?.code === 'string') {
    // Connection exceptions, operator intervention (restart, terminate), lock and statement timeouts.
    // SQLSTATE classes: connection (08), read-only after a failover (25), out of resources (53),
    // not available (55: lock timeouts), operator intervention and cancels (57), rollbacks (40).
    if (/^(08|25|40|53|55|57)[0-9A-Z]{3}$/.test(e.code)) return true;
    if (['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EPIPE', 'ENOTFOUND', 'EAI_AGAIN'].includes(e.code))
      return true;
  }
  const message = typeof e?.message === 'string' ? e.message : '';
  // `Query read timeout`: a statement unanswered past the store's bound (a connection gone silent).
  return /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|Query read timeout|PGlite is closed/i.test(
    message,
  );
}
