/**
 * How long a client refused by a cap that frees as runs move on should wait. By Little's law a
 * run stays in a set for about L / λ (L runs in the set, λ of them leaving per second): that is
 * the time after which the set has turned over, the wait we suggest. The `openai` client ignores
 * a Retry-After over 60 s (and retries at once instead), so the estimate never goes above it,
 * nor below 1 s.
 */
export const RETRY_AFTER_MIN_MS = 1_000;
export const RETRY_AFTER_MAX_MS = 60_000;
/** With nothing observed yet: the spec's fixed figure for the concurrency cap. */
export const RETRY_AFTER_UNKNOWN_MS = 30_000;
/** How far back departures count: recent enough to follow a change of pace. */
export const HISTORY_WINDOW_MS = 60_000;
/** A shorter span says nothing about a rate. */
export const MIN_SPAN_MS = 1_000;

export interface Departures {
  /** Runs in the set now. */
  active: number;
  /** Runs that left the set over `spanMs`. */
  left: number;
  spanMs: number;
}

/** The wait for a place, in whole milliseconds, clamped to [1 s, 60 s]. */
export function estimateRetryAfterMs({ active, left, spanMs }: Departures): number {
  if (!(spanMs >= MIN_SPAN_MS)) return RETRY_AFTER_UNKNOWN_MS;
  const runs = Math.max(active, 1);
  // No run left in the span: the rate is below about one per span, so the wait is at least
  // runs x span; a short span says little more than that, so never less than the default.
  const wait = left > 0 ? (runs * spanMs) / left : Math.max(RETRY_AFTER_UNKNOWN_MS, runs * spanMs);
  return Math.round(Math.min(RETRY_AFTER_MAX_MS, Math.max(RETRY_AFTER_MIN_MS, wait)));
}

/** The header's value: whole seconds, rounded up so a client never comes back before the estimate. */
export const retryAfterSeconds = (ms: number) => Math.ceil(ms / 1000);

export type CountedSet = 'active' | 'scheduled' | 'deferred';

export interface Observation {
  /** The clock's time of the read. */
  at: number;
  /** Runs in each set. */
  counts: Record<CountedSet, number>;
  /** Runs that ever left each set (monotonic, across every process sharing the store). */
  left: Record<CountedSet, number>;
}

/**
 * A tenant's counter reads over the last minute, thinned to one a second, from which the rate of
 * departures is read. Fed by every counters read of admission (and, while admissions go through
 * without one, a read beside them once a second), so it is freshest where it matters: while the
 * tenant is at a cap, each refused request reads the counters.
 */
export class DepartureHistory {
  #samples: Observation[] = [];
  #latest: Observation | undefined;

  record(observation: Observation): void {
    this.#latest = observation;
    const last = this.#samples.at(-1);
    if (last === undefined || observation.at - last.at >= MIN_SPAN_MS) this.#samples.push(observation);
    const horizon = observation.at - HISTORY_WINDOW_MS;
    // Keep the last sample at or before the horizon: the span then covers the whole window.
    while (this.#samples.length > 1 && this.#samples[1]!.at <= horizon) this.#samples.shift();
  }

  /** The estimate for one set, from the oldest sample in the window to the latest read. */
  estimate(set: CountedSet): number {
    const latest = this.#latest;
    const base = this.#samples[0];
    if (latest === undefined || base === undefined) return RETRY_AFTER_UNKNOWN_MS;
    return estimateRetryAfterMs({
      active: latest.counts[set],
      left: latest.left[set] - base.left[set],
      spanMs: latest.at - base.at,
    });
  }
}
