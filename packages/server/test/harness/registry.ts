// The one cleanup registry of the server tests. Whatever a test starts (a server, a stand-in,
// a database, a proxy, a child process) registers how to close it here, and the setup file's
// `afterEach` closes it after that test, last registered first. Something started for a whole
// file (in `beforeAll`) registers with `afterThisFile` instead and is closed after its last test.
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
let inFileHook = false;
const current = () => (inFileHook ? fileScope : testScope);

/**
 * Runs `cleanup` after the current test (after the file, inside `inFileScope`), last registered
 * first; then `probe`, if given, says what of the resource is still open.
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

/**
 * Marks the body of a `beforeAll` (see `beforeAllTests`): what it registers belongs to the
 * file, not to the first test that happens to run after it.
 */
export async function inFileScope<T>(start: () => Promise<T>): Promise<T> {
  inFileHook = true;
  try {
    return await start();
  } finally {
    inFileHook = false;
  }
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
