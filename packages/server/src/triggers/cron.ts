import { CronExpressionParser } from 'cron-parser';

/**
 * Schedules are five-field cron expressions (minute, hour, day of month, month, day of week)
 * or one of the `@hourly`-style names, read in UTC. Seconds are not offered: a tick creates a
 * run, and a run a second is a flood, not a schedule.
 */

const MAX_LENGTH = 200;
const aliases = ['@yearly', '@annually', '@monthly', '@weekly', '@daily', '@hourly'];

/** Why `expression` is not a schedule, or undefined when it is one. */
export function cronProblem(expression: string): string | undefined {
  const text = expression.trim();
  if (text.length === 0 || expression.length > MAX_LENGTH)
    return `a schedule is 1 to ${MAX_LENGTH} characters`;
  if (text.startsWith('@')) {
    return aliases.includes(text.toLowerCase()) ? undefined : `the named schedules are ${aliases.join(', ')}`;
  }
  const fields = text.split(/\s+/).length;
  if (fields !== 5)
    return `a schedule has 5 fields (minute hour day-of-month month day-of-week), this has ${fields}`;
  try {
    CronExpressionParser.parse(text, { tz: 'UTC', currentDate: new Date(0) });
    return undefined;
  } catch (error) {
    return error instanceof Error ? error.message : String(error);
  }
}

/** The latest tick of `expression` at or before `nowMs` (epoch ms), or undefined when none was. */
export function latestTick(expression: string, nowMs: number): number | undefined {
  // The parser's prev() is strictly before its current date: start one millisecond later, so a
  // tick that falls exactly on `nowMs` counts as come.
  const parsed = CronExpressionParser.parse(expression.trim(), {
    tz: 'UTC',
    currentDate: new Date(nowMs + 1),
  });
  try {
    return parsed.prev().getTime();
  } catch {
    // No earlier occurrence (an expression with nothing before `nowMs`).
    return undefined;
  }
}

/** The first tick of `expression` after `afterMs` (epoch ms), or undefined when none comes. */
export function nextTick(expression: string, afterMs: number): number | undefined {
  const parsed = CronExpressionParser.parse(expression.trim(), { tz: 'UTC', currentDate: new Date(afterMs) });
  try {
    return parsed.next().getTime();
  } catch {
    return undefined;
  }
}
