/** Where a run failed: its limiter and workload, and its place in the run tree. */
export interface RunErrorFields {
  /** The run's limiter, or `'none'` for a run without one. */
  readonly limiter: string;
  readonly workload: string | undefined;
  readonly runId: string;
  readonly rootRunId: string;
  readonly parentRunId: string | undefined;
  /** The provider request the failure belongs to, when it belongs to one. */
  readonly requestId?: string | undefined;
}

/**
 * Base of the agent runtime's own failures. It carries the same fields as `ConcurrencyError`,
 * so one log line or alert reads both; it does not extend it, because these are not limiter
 * failures and `instanceof ConcurrencyError` must keep meaning that.
 */
abstract class RunError extends Error {
  readonly limiter: string;
  readonly workload: string | undefined;
  readonly runId: string;
  readonly rootRunId: string;
  readonly parentRunId: string | undefined;
  readonly requestId: string | undefined;

  constructor(message: string, fields: RunErrorFields) {
    super(message);
    this.name = new.target.name;
    this.limiter = fields.limiter;
    this.workload = fields.workload;
    this.runId = fields.runId;
    this.rootRunId = fields.rootRunId;
    this.parentRunId = fields.parentRunId;
    this.requestId = fields.requestId;
  }
}

/** The run passed its `timeoutMs`, or its parent's budget ran out. */
export class RunTimeoutError extends RunError {
  /** The budget the run had, in ms. */
  readonly timeoutMs: number;

  constructor(fields: RunErrorFields & { timeoutMs: number }) {
    super(`Run ${fields.runId} passed its time budget of ${fields.timeoutMs} ms`, fields);
    this.timeoutMs = fields.timeoutMs;
  }
}

/** The model kept answering in a form the run cannot use, past `maxRepairs` corrective turns. */
export class RepairLimitError extends RunError {
  /** Corrective turns the run took before giving up. */
  readonly repairs: number;
  /** What was wrong with the answer that was one too many. */
  readonly lastProblem: string;

  constructor(fields: RunErrorFields & { repairs: number; lastProblem: string }) {
    super(
      `Run ${fields.runId} gave up after ${fields.repairs} corrective turns: ${fields.lastProblem}`,
      fields,
    );
    this.repairs = fields.repairs;
    this.lastProblem = fields.lastProblem;
  }
}
