import { closeFileScope, closeTestScope, fileScopeOpen } from './registry.js';
import { earlierSluiceTimerPending, forgetTimers, pendingSluiceTimers } from './timers.js';

// The leak guard of the server tests (installed by setup.ts). After each test it closes what
// the test registered, then fails the test if:
//   - a close threw, or a close registered something new;
//   - a probe of a registered resource says part of it is still open: a server still
//     listening or executing a run, a run its server left `running` in the database, a pool
//     with connections;
//   - a timer set by Sluice's code (packages/*/src) during the test is still pending: what a
//     server started by hand and never closed leaves behind (its sweeps, its workers' watch).
// Every check is a fact read once after the closes, never a wait: it cannot flake on time.
// While something started for the whole file is open (registered with `afterThisFile`, or a
// server a `beforeAll` started whose timers are still pending), timers are expected: they are
// checked once after the file, when its own `afterAll` has closed what it started.

export class LeakError extends Error {
  constructor(readonly leaks: readonly string[]) {
    super(`Leak guard: the test left ${leaks.length} thing(s) behind:\n  - ${leaks.join('\n  - ')}`);
    this.name = 'LeakError';
  }
}

/** Closes what the current test registered and returns what it left behind. */
export async function findTestLeaks(): Promise<string[]> {
  const leaks = await closeTestScope();
  if (fileScopeOpen() || earlierSluiceTimerPending()) return leaks;
  return [...leaks, ...takePendingTimers()];
}

/** Closes what the file registered (its `beforeAll` servers) and returns what was left behind. */
export async function findFileLeaks(): Promise<string[]> {
  return [...(await closeFileScope()), ...takePendingTimers()];
}

function takePendingTimers(): string[] {
  const left = pendingSluiceTimers().map((t) => `a pending timer: ${t}`);
  forgetTimers();
  return left;
}

/** Throws a `LeakError` naming every leak, if any. */
export function assertNoLeaks(leaks: readonly string[]): void {
  if (leaks.length > 0) throw new LeakError(leaks);
}
