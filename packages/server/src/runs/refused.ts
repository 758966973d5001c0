import type { Refusal } from './refusal.js';

/**
 * Why creating (or resuming) a run was turned down, as data: each kind carries what a client
 * needs to act (the field, the limit and its value, the run in the way), and no transport.
 * `http/errors.ts` gives each kind its status, body and headers; the WebSocket and trigger
 * fronts go through the same mapping.
 */
export type RunRefusal =
  /** Admission's: a cap, the quota, the spend limit, or a thread lost while admitting. */
  | Refusal
  | InvalidInput
  | { kind: 'thread_missing'; threadId: string }
  /** An image part names a file the tenant does not have (another tenant's is not there either). */
  | { kind: 'file_missing'; fileId: string; field: string }
  /** The thread stayed busy for the whole wait. */
  | { kind: 'thread_busy'; threadId: string; activeRunId: string | null; waitedMs: number }
  /** The thread's run waits for a person: waiting behind it is pointless. */
  | { kind: 'thread_requires_action'; threadId: string; runId: string }
  /** `on_busy: 'cancel'` would cancel a run the caller may not cancel (another project's). */
  | { kind: 'thread_forbidden'; threadId: string; activeRunId: string; paused: boolean }
  /** This process is shutting down: the request belongs on another one. */
  | { kind: 'draining' };

/** Input the schema let through but the run cannot take: the message says why. */
export interface InvalidInput {
  kind: 'invalid_input';
  field: string;
  message: string;
  limitValue?: number;
  /** For approvals: the calls that wait for an answer, or those left unanswered. */
  pending?: readonly string[];
  missing?: readonly string[];
}

/** The API error type (`error.type`, `error.code`) of each refusal; fixed by the public surface. */
export function refusalCode(refusal: RunRefusal): string {
  switch (refusal.kind) {
    case 'concurrency':
      return 'agent_run_concurrency_limit';
    case 'quota':
      return 'agent_quota_exceeded';
    case 'spend':
      return 'spend_limit_exceeded';
    case 'thread':
    case 'thread_busy':
      return 'thread_busy';
    case 'invalid_input':
      return 'invalid_request';
    case 'thread_missing':
    case 'file_missing':
      return 'not_found';
    case 'thread_requires_action':
      return 'thread_requires_action';
    case 'thread_forbidden':
      return 'permission_denied';
    case 'draining':
      return 'server_draining';
    default: {
      const never: never = refusal;
      throw new Error(`unknown refusal ${JSON.stringify(never)}`);
    }
  }
}

/** A refusal thrown through the layers that do not handle it, up to a front that renders it. */
export class RunRefusedError extends Error {
  readonly refusal: RunRefusal;

  constructor(refusal: RunRefusal) {
    // An answer to a client, not a fault: no stack (see HttpError, whose cost this keeps).
    const limit = Error.stackTraceLimit;
    Error.stackTraceLimit = 0;
    super(refusal.kind === 'invalid_input' ? refusal.message : `run refused: ${refusal.kind}`);
    Error.stackTraceLimit = limit;
    this.name = 'RunRefusedError';
    this.refusal = refusal;
  }

  get code(): string {
    return refusalCode(this.refusal);
  }
}

/** Shorthand for the commonest refusal: input the run cannot take. */
export const invalidInput = (
  message: string,
  field: string,
  more: Pick<InvalidInput, 'limitValue' | 'pending' | 'missing'> = {},
) => new RunRefusedError({ ...more, kind: 'invalid_input', field, message });
