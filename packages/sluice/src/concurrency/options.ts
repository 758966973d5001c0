import { IMPLICIT_KEY, MAX_KEY_LENGTH } from './allocate.js';
import { SECOND, type Clock } from './clock.js';
import type { AdaptiveOptions, RateOptions } from './capacity-types.js';
import type { BudgetFigures } from './budgets.js';
import { ConcurrencyConfigError, lineageOf, type RequestLineage } from './errors.js';

/** Settings of one named workload. */
export interface WorkloadOptions {
  /**
   * Ceiling for this workload.
   * @default the limiter's `maxConcurrent`
   */
  maxConcurrent?: number;
  /**
   * Slots only this workload may use, counted inside the limiter's `maxConcurrent`.
   * They are never lent to another workload, even when idle.
   * @default 0
   */
  reserved?: number;
  /**
   * Among workloads that have room, the higher value is served first.
   * @default 0
   */
  priority?: number;
  /** Longest a request may wait for a slot. The run's own deadline can make it shorter. */
  maxWaitMs?: number;
}

/** Options of {@link createConcurrencyLimiter}. `W` is the union of workload names. */
export interface ConcurrencyLimiterOptions<W extends string = string> {
  /** Most provider requests in flight at once. */
  maxConcurrent: number;
  /** Most requests waiting for a slot; more fail with `ConcurrencyQueueFullError`. Omit for no limit. */
  maxQueued?: number;
  /** Named workloads sharing the capacity. Omit for the single workload `'default'`. */
  workloads?: Record<W, WorkloadOptions>;
  /**
   * Workload of requests that name none.
   * @default `'default'` when it exists, else the only workload
   */
  defaultWorkload?: NoInfer<W>;
  /**
   * Name in events and errors; limiters sharing storage share slots by name.
   * @default 'default'
   */
  name?: string;
  /**
   * How long a slot stays valid without renewal. The runtime renews it while a request runs.
   * @default 30000
   */
  leaseTtlMs?: number;
  /** Time source; tests pass a `ManualClock`. @default the system clock */
  clock?: Clock;
  /** Per-minute budgets of requests and tokens, beside the slots. */
  rate?: RateOptions;
  /** Adapt the effective limit to the provider's overload signals (`true`: the defaults). */
  adaptive?: boolean | AdaptiveOptions;
}

/** Every default of the limiter, in one place. */
export const limiterDefaults = Object.freeze({
  name: 'default',
  workload: 'default',
  leaseTtlMs: 30 * SECOND,
  reserved: 0,
  priority: 0,
});

/** A workload after validation: every field present. */
export interface ResolvedWorkload<W extends string = string> {
  readonly name: W;
  readonly index: number;
  readonly maxConcurrent: number;
  readonly reserved: number;
  readonly priority: number;
  readonly maxWaitMs: number | undefined;
}

/** Limits after validation, frozen; all the limiter internals see. */
export interface ResolvedLimits<W extends string = string> {
  readonly name: string;
  readonly maxConcurrent: number;
  readonly maxQueued: number | undefined;
  readonly leaseTtlMs: number;
  readonly defaultWorkload: W | undefined;
  /** Workloads in declaration order; `index` is the position here. */
  readonly workloads: readonly ResolvedWorkload<W>[];
  /** Slots not reserved by any workload: `maxConcurrent` minus every reservation. */
  readonly sharedSlots: number;
  /** The budgets' per-minute figures, by budget name; absent without `rate`. */
  readonly rate: BudgetFigures | undefined;
  /** The adaptive limit's settings; absent without `adaptive`. */
  readonly adaptive: ResolvedAdaptive | undefined;
}

/** `adaptive` after validation. */
export interface ResolvedAdaptive {
  /** The effective limit's floor. */
  readonly minConcurrent: number;
}

const limiterKeys = new Set([
  'maxConcurrent',
  'maxQueued',
  'workloads',
  'defaultWorkload',
  'name',
  'leaseTtlMs',
  'clock',
  'rate',
  'adaptive',
]);
const rateKeys: Record<string, keyof BudgetFigures> = {
  requestsPerMinute: 'requests',
  tokensPerMinute: 'tokens',
  inputTokensPerMinute: 'inputTokens',
  outputTokensPerMinute: 'outputTokens',
};
const adaptiveKeys = new Set(['minConcurrent']);
const workloadKeys = new Set(['maxConcurrent', 'reserved', 'priority', 'maxWaitMs']);

function show(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'number' || typeof value === 'boolean' || value === null || value === undefined)
    return String(value);
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return Object.prototype.toString.call(value);
  }
}

/**
 * A `ConcurrencyConfigError` in the one message style of every limiter option:
 * ``Expected `field` to be <expected>, got `<value>` ``. For limiters with options of their own.
 *
 * @example
 * throw optionError('claude', 'pollIntervalMs', 'a whole number >= 1', 0);
 * // Expected `pollIntervalMs` to be a whole number >= 1, got `0`
 */
export function optionError(
  limiter: string,
  field: string,
  expected: string,
  value: unknown,
): ConcurrencyConfigError {
  return new ConcurrencyConfigError(`Expected \`${field}\` to be ${expected}, got \`${show(value)}\``, {
    limiter,
    field,
    value,
  });
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * Validates limiter options, each against the others too, and returns frozen limits.
 * Throws `ConcurrencyConfigError` naming the field, what was expected and what came.
 *
 * @param extraKeys option names a particular limiter adds (the PostgreSQL limiter's `db`, ...)
 */
export function resolveLimiterOptions<W extends string>(
  options: ConcurrencyLimiterOptions<W>,
  extraKeys: ReadonlySet<string> = new Set(),
): ResolvedLimits<W> {
  const rawName = isPlainObject(options) ? options.name : undefined;
  const limiter = typeof rawName === 'string' && rawName.length > 0 ? rawName : limiterDefaults.name;
  const fail = (field: string, expected: string, value: unknown): never => {
    throw optionError(limiter, field, expected, value);
  };
  const wholeNumber = (
    field: string,
    value: unknown,
    min: number,
    max = Number.MAX_SAFE_INTEGER,
    why = '',
  ) => {
    if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < min || value > max) {
      const range = max === Number.MAX_SAFE_INTEGER ? `>= ${min}` : `between ${min} and ${max}${why}`;
      fail(field, `a whole number ${range}`, value);
    }
    return value as number;
  };

  if (!isPlainObject(options)) fail('options', 'an object', options);
  for (const key of Object.keys(options)) {
    if (!limiterKeys.has(key) && !extraKeys.has(key)) fail(key, 'a known option (misspelt?)', key);
  }
  if (options.name !== undefined && (typeof options.name !== 'string' || options.name.trim() === '')) {
    fail('name', 'a non-empty string', options.name);
  }
  const maxConcurrent = wholeNumber('maxConcurrent', options.maxConcurrent, 1);
  const maxQueued =
    options.maxQueued === undefined ? undefined : wholeNumber('maxQueued', options.maxQueued, 0);
  const leaseTtlMs =
    options.leaseTtlMs === undefined
      ? limiterDefaults.leaseTtlMs
      : wholeNumber('leaseTtlMs', options.leaseTtlMs, 1);

  const rawWorkloads: Record<string, unknown> =
    options.workloads === undefined
      ? { [limiterDefaults.workload]: {} }
      : (options.workloads as Record<string, unknown>);
  if (!isPlainObject(rawWorkloads) || Object.keys(rawWorkloads).length === 0) {
    fail('workloads', 'an object with at least one workload', options.workloads);
  }

  const workloads: ResolvedWorkload<W>[] = [];
  let reservedSum = 0;
  for (const [name, raw] of Object.entries(rawWorkloads)) {
    const at = `workloads.${name}`;
    if (name.trim() === '') fail('workloads', 'workload names that are non-empty strings', name);
    if (raw === undefined) continue;
    if (!isPlainObject(raw)) fail(at, 'an object', raw);
    const w = raw as Record<string, unknown>;
    for (const key of Object.keys(w)) {
      if (!workloadKeys.has(key)) fail(`${at}.${key}`, 'a known workload option (misspelt?)', key);
    }
    const ceiling =
      w.maxConcurrent === undefined
        ? maxConcurrent
        : wholeNumber(
            `${at}.maxConcurrent`,
            w.maxConcurrent,
            1,
            maxConcurrent,
            " (the limiter's maxConcurrent)",
          );
    const reserved =
      w.reserved === undefined
        ? limiterDefaults.reserved
        : wholeNumber(`${at}.reserved`, w.reserved, 0, ceiling, ` (the workload's ceiling)`);
    const priority =
      w.priority === undefined
        ? limiterDefaults.priority
        : wholeNumber(`${at}.priority`, w.priority, Number.MIN_SAFE_INTEGER);
    const maxWaitMs = w.maxWaitMs === undefined ? undefined : wholeNumber(`${at}.maxWaitMs`, w.maxWaitMs, 0);
    reservedSum += reserved;
    workloads.push(
      Object.freeze({
        name: name as W,
        index: workloads.length,
        maxConcurrent: ceiling,
        reserved,
        priority,
        maxWaitMs,
      }),
    );
  }
  if (reservedSum > maxConcurrent) {
    const parts = workloads.filter((w) => w.reserved > 0).map((w) => `${w.name}: ${w.reserved}`);
    throw new ConcurrencyConfigError(
      `Expected the reservations to sum to at most \`maxConcurrent\` (${maxConcurrent}), got ${reservedSum} (${parts.join(', ')})`,
      { limiter, field: 'workloads.*.reserved', value: reservedSum },
    );
  }

  const starved = workloads.find((w) => w.reserved === 0);
  if (reservedSum === maxConcurrent && starved) {
    throw new ConcurrencyConfigError(
      `Workload \`${starved.name}\` could never get a slot: the reservations take all ${maxConcurrent} of \`maxConcurrent\` and it reserves none`,
      { limiter, workload: starved.name, field: `workloads.${starved.name}.reserved`, value: 0 },
    );
  }

  const names = workloads.map((w) => w.name as string);
  let defaultWorkload: W | undefined;
  if (options.defaultWorkload !== undefined) {
    if (typeof options.defaultWorkload !== 'string' || !names.includes(options.defaultWorkload)) {
      fail(
        'defaultWorkload',
        `one of the workloads (${names.map(show).join(', ')})`,
        options.defaultWorkload,
      );
    }
    defaultWorkload = options.defaultWorkload;
  } else if (names.includes(limiterDefaults.workload)) {
    defaultWorkload = limiterDefaults.workload as W;
  } else if (names.length === 1) {
    defaultWorkload = names[0] as W;
  }

  const rate = resolveRate(options.rate, fail);
  const adaptive = resolveAdaptive(options.adaptive, workloads, maxConcurrent, fail);

  return Object.freeze({
    name: limiter,
    maxConcurrent,
    maxQueued,
    leaseTtlMs,
    defaultWorkload,
    workloads: Object.freeze(workloads),
    sharedSlots: maxConcurrent - reservedSum,
    rate,
    adaptive,
  });
}

type Fail = (field: string, expected: string, value: unknown) => never;

/** `rate`: each figure absent or a positive finite number; stored by budget name. */
function resolveRate(raw: unknown, fail: Fail): BudgetFigures | undefined {
  if (raw === undefined) return undefined;
  if (!isPlainObject(raw)) fail('rate', 'an object', raw);
  const figures: Partial<Record<keyof BudgetFigures, number>> = {};
  for (const [key, value] of Object.entries(raw as Record<string, unknown>)) {
    const budget = Object.hasOwn(rateKeys, key) ? rateKeys[key] : undefined;
    if (budget === undefined) fail(`rate.${key}`, 'a known rate option (misspelt?)', key);
    if (value === undefined) continue;
    if (typeof value !== 'number' || !Number.isFinite(value) || value <= 0) {
      fail(`rate.${key}`, 'a positive finite number', value);
    }
    // Every request takes 1 from the request budget: below 1 none could ever be granted.
    if (budget === 'requests' && (value as number) < 1) {
      fail(`rate.${key}`, 'a finite number >= 1 (each request takes 1)', value);
    }
    figures[budget!] = value as number;
  }
  return Object.freeze(figures);
}

/**
 * The adaptive limit's floor by default: every reservation, plus one shared slot when some
 * workload reserves none (else that workload could be left without any slot), and at least 1.
 */
export function adaptiveFloor(workloads: readonly { readonly reserved: number }[]): number {
  const reserved = workloads.reduce((sum, w) => sum + w.reserved, 0);
  return Math.max(1, reserved + (workloads.some((w) => w.reserved === 0) ? 1 : 0));
}

function resolveAdaptive(
  raw: unknown,
  workloads: readonly ResolvedWorkload[],
  maxConcurrent: number,
  fail: Fail,
): ResolvedAdaptive | undefined {
  if (raw === undefined || raw === false) return undefined;
  const floor = adaptiveFloor(workloads);
  if (raw === true) return Object.freeze({ minConcurrent: floor });
  if (!isPlainObject(raw)) fail('adaptive', 'true, false or an object', raw);
  const options = raw as Record<string, unknown>;
  for (const key of Object.keys(options)) {
    if (!adaptiveKeys.has(key)) fail(`adaptive.${key}`, 'a known adaptive option (misspelt?)', key);
  }
  const min = options.minConcurrent;
  if (min === undefined) return Object.freeze({ minConcurrent: floor });
  if (typeof min !== 'number' || !Number.isSafeInteger(min) || min < floor || min > maxConcurrent) {
    const why = floor > 1 ? ' (the reservations, plus 1 when a workload reserves none)' : '';
    fail(
      'adaptive.minConcurrent',
      `a whole number between ${floor}${why} and ${maxConcurrent} (maxConcurrent)`,
      min,
    );
  }
  return Object.freeze({ minConcurrent: min as number });
}

/**
 * Resolves the workload a request runs in: the one it names, else the limiter's default.
 * Throws `ConcurrencyConfigError` for an unknown name, or when none is named and the limiter
 * has several workloads and no default; the error carries `lineage` (the request's run ids).
 */
export function resolveWorkload<W extends string>(
  limits: ResolvedLimits<W>,
  workload: string | undefined,
  lineage: RequestLineage = {},
): ResolvedWorkload<W> {
  const name = workload ?? limits.defaultWorkload;
  if (name === undefined) {
    const names = limits.workloads.map((w) => show(w.name)).join(', ');
    throw new ConcurrencyConfigError(
      `Limiter \`${limits.name}\` has several workloads (${names}) and no defaultWorkload: a request must name one`,
      { limiter: limits.name, ...lineageOf(lineage), field: 'workload', value: undefined },
    );
  }
  const found = limits.workloads.find((w) => w.name === name);
  if (!found) {
    const names = limits.workloads.map((w) => show(w.name)).join(', ');
    throw new ConcurrencyConfigError(
      `Expected \`workload\` to be one of limiter \`${limits.name}\`'s workloads (${names}), got \`${show(name)}\``,
      { limiter: limits.name, workload: String(name), ...lineageOf(lineage), field: 'workload', value: name },
    );
  }
  return found;
}

/**
 * Checks a request's fairness key: absent (the implicit key), or a non-empty string of at
 * most `MAX_KEY_LENGTH` characters. A key is stored by the PostgreSQL limiter with every
 * queued request, so its length is bounded; an empty string is kept for the implicit key.
 */
export function resolveKey(
  limits: { readonly name: string },
  key: unknown,
  workload: string,
  lineage: RequestLineage = {},
): string {
  if (key === undefined) return IMPLICIT_KEY;
  if (typeof key !== 'string' || key.length < 1 || key.length > MAX_KEY_LENGTH) {
    const got =
      typeof key === 'string' && key.length > 40
        ? `a string of ${key.length} characters (${show(key.slice(0, 40))}...)`
        : `\`${show(key)}\``;
    throw new ConcurrencyConfigError(
      `Expected \`key\` to be a string of 1 to ${MAX_KEY_LENGTH} characters, got ${got}`,
      { limiter: limits.name, workload, ...lineageOf(lineage), field: 'key', value: key },
    );
  }
  return key;
}
