import { systemClock, type Clock } from '../concurrency/clock.js';
import { agentDefaults, maxTimerMs } from './defaults.js';

/** Bounds on what one run may do. */
export interface RunBounds {
  /** Most tool calls running at once in a run. @default 10 */
  maxParallelToolCalls?: number;
  /** Longest one tool call may run; it then fails with an error result. No default. */
  toolTimeoutMs?: number;
  /** Longest one provider request may take once sent. No default. */
  turnTimeoutMs?: number;
}

/** Our own retries of transient provider failures. Each retry is a new request with a new slot. */
export interface RetryOptions {
  /** Retries after the first attempt. @default 3 */
  maxRetries?: number;
  /** First backoff; doubles each time, with full jitter. @default 500 */
  baseDelayMs?: number;
  /** Longest backoff (a wait the provider names is honoured as it is). @default 30000 */
  maxDelayMs?: number;
}

export interface CompactionOptions {
  /**
   * Summarise when the conversation's JSON passes this many characters. Without it, only a
   * context-overflow error from the provider triggers a summary.
   */
  maxChars?: number;
  /** Recent messages kept word for word. @default 6 */
  keepLast?: number;
}

/**
 * The options of `createAgent` that govern its runs (bounds, retries, repairs, compaction,
 * time), before validation.
 */
export interface RuntimeOptions {
  bounds?: RunBounds | undefined;
  retry?: RetryOptions | undefined;
  maxRepairs?: number | undefined;
  compaction?: CompactionOptions | undefined;
  clock?: Clock | undefined;
}

/** The same after validation, frozen, with every default filled in: all the runtime sees. */
export interface ResolvedRuntimeOptions {
  readonly bounds: Readonly<{
    maxParallelToolCalls: number;
    toolTimeoutMs: number | undefined;
    turnTimeoutMs: number | undefined;
  }>;
  readonly retry: Readonly<Required<RetryOptions>>;
  readonly maxRepairs: number;
  readonly compaction: Readonly<{ maxChars: number | undefined; keepLast: number }>;
  readonly clock: Clock;
}

const knownKeys = {
  bounds: ['maxParallelToolCalls', 'toolTimeoutMs', 'turnTimeoutMs'],
  retry: ['maxRetries', 'baseDelayMs', 'maxDelayMs'],
  compaction: ['maxChars', 'keepLast'],
} as const;

function show(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value);
  try {
    return typeof value === 'object' && value !== null
      ? (JSON.stringify(value) ?? String(value))
      : String(value);
  } catch {
    return Object.prototype.toString.call(value);
  }
}

/** Throws the `TypeError` of a bad option: what was expected of `field` and what came. */
export function fail(field: string, expected: string, value: unknown): never {
  throw new TypeError(`Expected \`${field}\` to be ${expected}, got \`${show(value)}\``);
}

function wholeNumber(field: string, value: unknown, min: number): number {
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min) {
    fail(field, `a whole number >= ${min}`, value);
  }
  return value;
}

/** A duration a timer will wait: `> 0` (or `>= 0`) and no longer than Node's longest timer. */
export function duration(field: string, value: unknown, { zero = false } = {}): number {
  const ok = typeof value === 'number' && (zero ? value >= 0 : value > 0) && value <= maxTimerMs;
  if (!ok) fail(field, `a number of ms ${zero ? '>= 0' : '> 0'} and at most ${maxTimerMs}`, value);
  return value as number;
}

function section<K extends keyof typeof knownKeys>(
  name: K,
  value: unknown,
): Partial<Record<(typeof knownKeys)[K][number], unknown>> {
  if (value === undefined) return {};
  if (typeof value !== 'object' || value === null || Array.isArray(value)) fail(name, 'an object', value);
  const known: readonly string[] = knownKeys[name];
  for (const key of Object.keys(value)) {
    if (!known.includes(key)) fail(`${name}.${key}`, `one of ${known.join(', ')} (misspelt?)`, key);
  }
  return value as Partial<Record<(typeof knownKeys)[K][number], unknown>>;
}

/**
 * Validates the agent options that shape its runs and fills in the defaults. Throws a
 * `TypeError` naming the field, what was expected and what came.
 */
export function resolveRuntimeOptions(options: RuntimeOptions): ResolvedRuntimeOptions {
  const bounds = validBounds(options.bounds);
  const retry = section('retry', options.retry);
  const compaction = section('compaction', options.compaction);
  const clock = options.clock ?? systemClock;
  if (typeof clock !== 'object' || clock === null) fail('clock', 'a Clock', clock);
  for (const method of ['now', 'setTimeout', 'clearTimeout'] as const) {
    const value = (clock as unknown as Record<string, unknown>)[method];
    if (typeof value !== 'function') fail(`clock.${method}`, 'a function', value);
  }
  return Object.freeze({
    bounds: Object.freeze({
      maxParallelToolCalls: bounds.maxParallelToolCalls ?? agentDefaults.bounds.maxParallelToolCalls,
      toolTimeoutMs: bounds.toolTimeoutMs,
      turnTimeoutMs: bounds.turnTimeoutMs,
    }),
    retry: Object.freeze({
      maxRetries:
        retry.maxRetries === undefined
          ? agentDefaults.retry.maxRetries
          : wholeNumber('retry.maxRetries', retry.maxRetries, 0),
      baseDelayMs:
        retry.baseDelayMs === undefined
          ? agentDefaults.retry.baseDelayMs
          : duration('retry.baseDelayMs', retry.baseDelayMs, { zero: true }),
      maxDelayMs:
        retry.maxDelayMs === undefined
          ? agentDefaults.retry.maxDelayMs
          : duration('retry.maxDelayMs', retry.maxDelayMs, { zero: true }),
    }),
    maxRepairs:
      options.maxRepairs === undefined
        ? agentDefaults.maxRepairs
        : wholeNumber('maxRepairs', options.maxRepairs, 0),
    compaction: Object.freeze({
      maxChars:
        compaction.maxChars === undefined
          ? undefined
          : wholeNumber('compaction.maxChars', compaction.maxChars, 1),
      keepLast:
        compaction.keepLast === undefined
          ? agentDefaults.compaction.keepLast
          : wholeNumber('compaction.keepLast', compaction.keepLast, 0),
    }),
    clock,
  });
}

/** Bounds as given, checked, with nothing filled in. */
function validBounds(value: unknown): Record<keyof RunBounds, number | undefined> {
  const bounds = section('bounds', value);
  const optional = (field: string, ms: unknown) => (ms === undefined ? undefined : duration(field, ms));
  return {
    maxParallelToolCalls:
      bounds.maxParallelToolCalls === undefined
        ? undefined
        : wholeNumber('bounds.maxParallelToolCalls', bounds.maxParallelToolCalls, 1),
    toolTimeoutMs: optional('bounds.toolTimeoutMs', bounds.toolTimeoutMs),
    turnTimeoutMs: optional('bounds.turnTimeoutMs', bounds.turnTimeoutMs),
  };
}

/**
 * The bounds of one run: the agent's, tightened by the run's own `bounds`, checked by the same
 * rules (errors name `bounds.<field>`). A run can lower a bound or set one the agent leaves
 * open, never raise one: every value is the smaller of the two where both are set.
 */
export function runBounds(
  agent: ResolvedRuntimeOptions['bounds'],
  run: unknown,
): ResolvedRuntimeOptions['bounds'] {
  if (run === undefined) return agent;
  const own = validBounds(run);
  const smaller = (a: number | undefined, b: number | undefined) =>
    a === undefined ? b : b === undefined ? a : Math.min(a, b);
  return Object.freeze({
    maxParallelToolCalls: Math.min(agent.maxParallelToolCalls, own.maxParallelToolCalls ?? Infinity),
    toolTimeoutMs: smaller(agent.toolTimeoutMs, own.toolTimeoutMs),
    turnTimeoutMs: smaller(agent.turnTimeoutMs, own.turnTimeoutMs),
  });
}
