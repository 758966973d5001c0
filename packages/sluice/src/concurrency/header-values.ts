/**
 * Parsers of the values found in providers' rate-limit headers. Each returns undefined for a
 * value it does not recognise, never throws, and never returns a negative, NaN or infinite
 * number: a header is information from the network, and a bad one must not stop a request
 * or a limiter.
 */

/** A count (`x-ratelimit-remaining-tokens: 149984`): a non-negative integer. */
export function parseCount(value: string): number | undefined {
  if (!/^\d+$/.test(value)) return undefined;
  const n = Number(value);
  return Number.isSafeInteger(n) ? n : undefined;
}

/** A non-negative decimal number (`retry-after: 20`, `retry-after-ms: 1500.5`). */
export function parseDecimal(value: string): number | undefined {
  if (!/^(?:\d+(?:\.\d*)?|\.\d+)$/.test(value)) return undefined;
  const n = Number(value);
  return Number.isFinite(n) ? n : undefined;
}

const durationUnitMs: Readonly<Record<string, number>> = {
  ns: 1e-6,
  us: 1e-3,
  µs: 1e-3, // U+00B5 MICRO SIGN
  μs: 1e-3, // U+03BC GREEK SMALL LETTER MU
  ms: 1,
  s: 1_000,
  m: 60_000,
  h: 3_600_000,
};

/** Go's time.Duration is an int64 of nanoseconds: longer durations fail to parse there too. */
const maxDurationMs = 9_223_372_036_854;

/**
 * A Go duration, as OpenAI writes its resets (`6m0s`, `1.5s`, `12ms`, `1h2m3.5s`, `0s`), in
 * ms, rounded up so a wait is never cut short. No sign is accepted (a reset is never in the
 * past). A bare number is taken as seconds: some OpenAI-compatible servers send `0` or `20`
 * there, and Go itself accepts a bare `0`.
 */
export function parseGoDuration(value: string): number | undefined {
  const bare = parseDecimal(value);
  if (bare !== undefined) return Math.ceil(bare * 1_000);
  if (!/^(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+$/.test(value)) return undefined;
  let total = 0;
  for (const [, amount, unit] of value.matchAll(/(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)/g)) {
    total += Number(amount) * durationUnitMs[unit!]!;
  }
  return Number.isFinite(total) && total <= maxDurationMs ? Math.ceil(total) : undefined;
}

/** An RFC 3339 date-time (`2025-08-21T12:40:59Z`), in ms since the epoch. */
export function parseRfc3339(value: string): number | undefined {
  const match =
    /^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:[Zz]|([+-])(\d{2}):(\d{2}))$/.exec(value);
  if (!match) return undefined;
  const [, year, month, day, hour, minute, second, fraction, sign, offsetHours, offsetMinutes] = match;
  const utc = utcTime(+year!, +month!, +day!, +hour!, +minute!, +second!);
  if (utc === undefined || +(offsetHours ?? 0) > 23 || +(offsetMinutes ?? 0) > 59) return undefined;
  const offsetMs = (+(offsetHours ?? 0) * 60 + +(offsetMinutes ?? 0)) * 60_000 * (sign === '-' ? -1 : 1);
  return utc + Number(fraction ?? '0') * 1_000 - offsetMs;
}

const months = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const month = `(${months.join('|')})`;
const time = '(\\d{2}):(\\d{2}):(\\d{2})';

/**
 * An HTTP date (RFC 9110 section 5.6.7), in ms since the epoch: the IMF-fixdate every server
 * should send (`Wed, 21 Oct 2015 07:28:00 GMT`), and the two obsolete forms a recipient must
 * still accept (RFC 850 `Wednesday, 21-Oct-15 07:28:00 GMT` and asctime
 * `Wed Oct 21 07:28:00 2015`). Always GMT, whatever the machine's time zone; `now` places an
 * RFC 850 two-digit year.
 */
export function parseHttpDate(value: string, now: number): number | undefined {
  let match = new RegExp(`^[A-Z][a-z]{2}, (\\d{2}) ${month} (\\d{4}) ${time} GMT$`).exec(value);
  if (match) return httpTime(match[3]!, match[2]!, match[1]!, match.slice(4));
  match = new RegExp(`^[A-Z][a-z]+, (\\d{2})-${month}-(\\d{2}) ${time} GMT$`).exec(value);
  if (match) {
    // Two-digit years: RFC 9110 reads one more than 50 years ahead as the past century.
    const year = 2000 + Number(match[3]);
    const thisYear = new Date(now).getUTCFullYear();
    return httpTime(String(year - thisYear > 50 ? year - 100 : year), match[2]!, match[1]!, match.slice(4));
  }
  match = new RegExp(`^[A-Z][a-z]{2} ${month} ([ \\d]\\d) ${time} (\\d{4})$`).exec(value);
  if (match) return httpTime(match[6]!, match[1]!, match[2]!.trim(), match.slice(3, 6));
  return undefined;
}

function httpTime(year: string, monthName: string, day: string, hms: string[]): number | undefined {
  return utcTime(+year, months.indexOf(monthName) + 1, +day, +hms[0]!, +hms[1]!, +hms[2]!);
}

/** The time of a calendar date and time in UTC, or undefined when no such moment exists. */
function utcTime(
  year: number,
  month: number,
  day: number,
  hour: number,
  minute: number,
  second: number,
): number | undefined {
  // Years before 1000 are no provider's reset (and Date.UTC reads 0 to 99 as 1900 to 1999).
  if (year < 1000 || month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || second > 60) {
    return undefined;
  }
  // Date.UTC rolls 31 February over into March: such a date is not a date.
  if (new Date(Date.UTC(year, month - 1, day)).getUTCDate() !== day) return undefined;
  // A leap second (:60) is read as the next second's start.
  return Date.UTC(year, month - 1, day, hour, minute, second);
}
