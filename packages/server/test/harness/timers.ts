import { syncBuiltinESMExports } from 'node:module';
import timers from 'node:timers';
import timersPromises from 'node:timers/promises';

// Which timers Sluice's own code (packages/*/src) set and has not cleared or seen fire. The
// global and `node:timers` setTimeout/setInterval, and `node:timers/promises` setTimeout, are
// wrapped once per test file: each call records its timer and a stack of one frame (the
// caller), formatted only for a timer still pending when the leak guard asks. The check is a
// fact about each timer (Node marks a cleared or fired one `_destroyed`), not a time window.
// A one-shot timer that was unref'd (a clock's `background` timer: a limiter's lease sweep)
// is not counted: it fires once and holds nothing up. An interval is counted either way.

interface Pending {
  readonly kind: 'setTimeout' | 'setInterval' | 'timers/promises setTimeout';
  isPending(): boolean;
  readonly site: { stack?: string };
}

const recorded: Pending[] = [];
const sluiceSource = /\/packages\/[\w-]+\/src\//;

function siteOf(caller: (...args: never[]) => unknown): { stack?: string } {
  const site: { stack?: string } = {};
  const limit = Error.stackTraceLimit;
  Error.stackTraceLimit = 1;
  Error.captureStackTrace(site, caller);
  Error.stackTraceLimit = limit;
  return site;
}

function record(entry: Pending): void {
  if (!tracking) return;
  recorded.push(entry);
  // A long test sets many timers; those already done need not be kept.
  if (recorded.length > 20_000) {
    const before = recorded.slice(0, testStart).filter((r) => r.isPending());
    const during = recorded.slice(testStart).filter((r) => r.isPending());
    recorded.splice(0, recorded.length, ...before, ...during);
    testStart = before.length;
  }
}

type TimerHandle = { _destroyed?: boolean; hasRef(): boolean };

let installed = false;
/** Whether this test file's timers are recorded: the server's test files only. */
let tracking = false;

/**
 * Records the timers of this test file, or not (`on` false). A worker that runs several files
 * (vitest's `isolate: false`) keeps the wrappers of the first; each file starts with none recorded.
 */
export function trackTimers(on = true): void {
  tracking = on;
  forgetTimers();
  if (installed || !on) return;
  installed = true;
  const original = {
    setTimeout: globalThis.setTimeout,
    setInterval: globalThis.setInterval,
    promisesSetTimeout: timersPromises.setTimeout,
  };
  const wrap = (kind: 'setTimeout' | 'setInterval', create: typeof setTimeout) => {
    const wrapped = function (this: unknown, ...args: Parameters<typeof setTimeout>) {
      const timer = create.apply(this, args) as unknown as TimerHandle;
      const isPending =
        kind === 'setInterval'
          ? () => timer._destroyed !== true
          : () => timer._destroyed !== true && timer.hasRef();
      record({ kind, site: siteOf(wrapped), isPending });
      return timer;
    };
    // util.promisify(setTimeout) and the like read this.
    Object.assign(wrapped, create);
    return wrapped as unknown as typeof setTimeout;
  };
  const setTimeoutWrapped = wrap('setTimeout', original.setTimeout);
  const setIntervalWrapped = wrap('setInterval', original.setInterval as unknown as typeof setTimeout);
  globalThis.setTimeout = setTimeoutWrapped;
  globalThis.setInterval = setIntervalWrapped as unknown as typeof setInterval;
  timers.setTimeout = setTimeoutWrapped;
  timers.setInterval = setIntervalWrapped as unknown as typeof setInterval;
  const promisesWrapped = function (...args: Parameters<typeof timersPromises.setTimeout>) {
    let pending = args[2]?.ref !== false;
    const site = siteOf(promisesWrapped);
    const promise = original.promisesSetTimeout(...args);
    record({ kind: 'timers/promises setTimeout', site, isPending: () => pending });
    promise.then(
      () => (pending = false),
      () => (pending = false),
    );
    return promise;
  } as typeof timersPromises.setTimeout;
  timersPromises.setTimeout = promisesWrapped;
  syncBuiltinESMExports();
}

let testStart = 0;

/** Starts a new window: timers recorded before it are no longer reported. */
export function forgetTimers(): void {
  recorded.length = 0;
  testStart = 0;
}

/** Marks where the current test's timers begin (the setup file's `beforeEach`). */
export function markTestStart(): void {
  testStart = recorded.length;
}

/**
 * Whether a timer Sluice's code set before the current test (in `beforeAll`, or in an earlier
 * test) is still pending: something started for the whole file is still running.
 */
export function earlierSluiceTimerPending(): boolean {
  return pendingSluiceTimers(recorded.slice(0, testStart)).length > 0;
}

/** The timers Sluice's code set since the window began and that are still pending, with where. */
export function pendingSluiceTimers(entries: readonly Pending[] = recorded): string[] {
  const left: string[] = [];
  for (const entry of entries) {
    if (!entry.isPending()) continue;
    const where = (entry.site.stack ?? '').split('\n')[1]?.trim() ?? '';
    if (sluiceSource.test(where)) left.push(`${entry.kind} ${where}`);
  }
  return left;
}
