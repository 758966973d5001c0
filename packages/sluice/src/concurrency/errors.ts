/** Where a limiter request came from: the run tree and the provider request. */
export interface RequestLineage {
  /** The run that sends the provider request. */
  readonly runId?: string | undefined;
  /** The outermost run of the tree (equal to `runId` for a top-level run). */
  readonly rootRunId?: string | undefined;
  /** The run whose tool started this run; absent for a top-level run. */
  readonly parentRunId?: string | undefined;
  /** The provider request the slot is for. */
  readonly requestId?: string | undefined;
}

/** The lineage fields of a request, and nothing else (no signal, no prompt). */
export function lineageOf(request: RequestLineage): RequestLineage {
  return {
    runId: request.runId,
    rootRunId: request.rootRunId,
    parentRunId: request.parentRunId,
    requestId: request.requestId,
  };
}

export interface ConcurrencyErrorFields extends RequestLineage {
  readonly limiter: string;
  readonly workload?: string | undefined;
  readonly cause?: unknown;
}

/**
 * Base class of every concurrency failure. Each carries the limiter's name, the workload
 * and the run lineage, so a log line or an alert can say exactly which request failed.
 */
export class ConcurrencyError extends Error {
  readonly limiter: string;
  readonly workload: string | undefined;
  readonly runId: string | undefined;
  readonly rootRunId: string | undefined;
  readonly parentRunId: string | undefined;
  readonly requestId: string | undefined;

  constructor(message: string, fields: ConcurrencyErrorFields) {
    super(message, fields.cause === undefined ? undefined : { cause: fields.cause });
    this.name = new.target.name;
    this.limiter = fields.limiter;
    this.workload = fields.workload;
    this.runId = fields.runId;
    this.rootRunId = fields.rootRunId;
    this.parentRunId = fields.parentRunId;
    this.requestId = fields.requestId;
  }
}

/** No slot came before the workload's `maxWaitMs` or the run's deadline. The provider was not called. */
export class ConcurrencyTimeoutError extends ConcurrencyError {
  /** How long the request waited. */
  readonly waitMs: number;
  /** The wait it was allowed: the smaller of `maxWaitMs` and the run's remaining budget. */
  readonly timeoutMs: number;

  constructor(fields: ConcurrencyErrorFields & { waitMs: number; timeoutMs: number }) {
    super(
      `No slot of limiter \`${fields.limiter}\` (workload \`${fields.workload}\`) within ${fields.timeoutMs} ms; waited ${fields.waitMs} ms`,
      fields,
    );
    this.waitMs = fields.waitMs;
    this.timeoutMs = fields.timeoutMs;
  }
}

/** The limiter's queue already held `maxQueued` requests. The provider was not called. */
export class ConcurrencyQueueFullError extends ConcurrencyError {
  readonly maxQueued: number;
  readonly queued: number;

  constructor(fields: ConcurrencyErrorFields & { maxQueued: number; queued: number }) {
    super(
      `Queue of limiter \`${fields.limiter}\` is full: ${fields.queued} requests waiting, maxQueued is ${fields.maxQueued}`,
      fields,
    );
    this.maxQueued = fields.maxQueued;
    this.queued = fields.queued;
  }
}

/** The limiter itself failed (its database is unreachable, say). Sluice fails closed: the provider was not called. */
export class ConcurrencyLimiterError extends ConcurrencyError {
  constructor(message: string, fields: ConcurrencyErrorFields) {
    super(message, fields);
  }
}

/** Invalid or conflicting limiter settings, or an unknown workload. */
export class ConcurrencyConfigError extends ConcurrencyError {
  /** The option at fault, as a path such as `workloads.background.maxConcurrent`. */
  readonly field: string | undefined;
  /** The value that was refused. */
  readonly value: unknown;

  constructor(message: string, fields: ConcurrencyErrorFields & { field?: string; value?: unknown }) {
    super(message, fields);
    this.field = fields.field;
    this.value = fields.value;
  }
}

/** The slot's lease could not be renewed before it expired; the provider request was aborted. */
export class ConcurrencyLeaseLostError extends ConcurrencyError {
  readonly leaseId: string;
  /** How long the slot had been held when it was lost. */
  readonly holdMs: number;

  constructor(fields: ConcurrencyErrorFields & { leaseId: string; holdMs: number }) {
    super(
      `Lease \`${fields.leaseId}\` of limiter \`${fields.limiter}\` was lost after ${fields.holdMs} ms; the request was aborted`,
      fields,
    );
    this.leaseId = fields.leaseId;
    this.holdMs = fields.holdMs;
  }
}

/** The provider answered with an error. The slot was released. */
export class TurnError extends ConcurrencyError {
  /** The provider's HTTP status, when there was one. */
  readonly status: number | undefined;
  /** Whether sending the request again could succeed (429, 5xx, overloaded, dropped connection). */
  readonly retryable: boolean;

  constructor(message: string, fields: ConcurrencyErrorFields & { status?: number; retryable?: boolean }) {
    super(message, fields);
    this.status = fields.status;
    this.retryable = fields.retryable ?? false;
  }
}
