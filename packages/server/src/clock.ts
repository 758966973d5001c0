import { systemClock, type Clock } from 'sluice/concurrency';

/**
 * The one clock of a server process: every component reads the time and sets its timers
 * through it, so tests drive the whole server with a `ManualClock`. `now` alone (the older
 * option, for schedule ticks) gives the system clock's timers with that reading of the time.
 * SQL that decides by the database's own time (`clock_timestamp()`, `now()`) keeps it: it is
 * how several processes on skewed hosts agree.
 */
export function appClock(options: { clock?: Clock; now?: () => number }): Clock {
  if (options.clock) return options.clock;
  const now = options.now;
  return now ? { ...systemClock, now: () => now() } : systemClock;
}

export { systemClock, type Clock };
