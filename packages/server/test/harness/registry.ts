// The one cleanup registry of the server tests. Whatever a test starts (a server, a stand-in,
// a database, a proxy, a child process) registers how to close it here, and the setup file's
// `afterEach` closes it after that test, last registered first. What a `beforeAll` starts
// belongs to the file instead, and is closed after the file's last test.
//
// A cleanup may come with a probe: right after the close (before what was registered earlier
// is closed, a database say), the leak guard asks it what of the resource is still open, so
// "closed" is checked, not assumed.

export type Cleanup = () => Promise<void> | void;
/** What of a resource is still open after its close: descriptions, empty when nothing. */
export type LeakProbe = () => Promise<string[]> | string[];

interface Entry {
  what: string;
  cleanup?: Cleanup;
  probe?: LeakProbe;
}
type Scope = Entry[];

const testScope: Scope = [];
const fileScope: Scope = [];
// Set by the setup file's first `beforeEach` and cleared by its last `afterEach`: outside
// them, a registration comes from a `beforeAll` (or an `afterAll`).
let inTest = false;
const current = () => (inTest ? testScope : fileScope);

export function enterTest(): void {
  inTest = true;
}

export function leaveTest(): void {
  inTest = false;
}

/**
 * Runs `cleanup` after the current test (after the file, when called from `beforeAll`), last
 * registered first; then `probe`, if given, says what of the resource is still open.
 */
export function afterThisTest(cleanup: Cleanup, what = 'a cleanup', probe?: LeakProbe): void {
  current().push({ what, cleanup, probe });
}

/** Runs `cleanup` after the file's last test (for what a `beforeAll` starts), last registered first. */
export function afterThisFile(cleanup: Cleanup, what = 'a cleanup', probe?: LeakProbe): void {
  fileScope.push({ what, cleanup, probe });
}

/** Asks `probe`, at this point of the closes (last registered first), what is still open. */
export function watchForLeaks(what: string, probe: LeakProbe): void {
  current().push({ what, probe });
}

/** Closes what the scope holds, last first; every close runs even when one fails. */
async function closeScope(scope: Scope): Promise<string[]> {
  const leaks: string[] = [];
  for (const { what, cleanup, probe } of scope.splice(0).reverse()) {
    try {
      await cleanup?.();
      for (const left of (await probe?.()) ?? []) leaks.push(`${what}: ${left}`);
    } catch (error) {
      leaks.push(`closing ${what} failed: ${error instanceof Error ? error.message : String(error)}`);
    }
  }
  // A close that registered another cleanup (it started something while closing) left it.
  for (const { what } of scope.splice(0)) leaks.push(`${what}, registered during the cleanup`);
  return leaks;
}

export const closeTestScope = () => closeScope(testScope);
export const closeFileScope = () => closeScope(fileScope);

/** Whether something started for the whole file is still open (its timers are then expected). */
export const fileScopeOpen = () => fileScope.length > 0;
