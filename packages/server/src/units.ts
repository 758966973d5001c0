import { MINUTE, SECOND } from 'sluice/concurrency';

/** Units for the server's durations and sizes: every default and tunable is written with them. */
export { MINUTE, SECOND };
export const HOUR = 60 * MINUTE;
export const DAY = 24 * HOUR;
export const KiB = 1024;
export const MiB = 1024 * KiB;
/** The longest delay `setTimeout` keeps: anything above fires after 1 ms. */
export const MAX_TIMER_MS = 2 ** 31 - 1;
