import { afterAll, afterEach, beforeEach, expect } from 'vitest';
import { assertNoLeaks, findFileLeaks, findTestLeaks } from './leak-guard.js';
import { enterTest, leaveTest } from './registry.js';
import { markTestStart, trackTimers } from './timers.js';

// The vitest setup file (vitest.config.ts `setupFiles`), run before each test file: after each
// test (and after the file) the cleanup registry closes what was registered and the leak guard
// (leak-guard.ts) fails the test if something was left behind. The server's test files also
// have their timers tracked. Registered here, first, so these hooks run after the file's own.

const serverTests = /\/packages\/server\/test\//;
trackTimers(serverTests.test(expect.getState().testPath ?? ''));

beforeEach(() => {
  enterTest();
  markTestStart();
});
afterEach(async () => {
  leaveTest();
  assertNoLeaks(await findTestLeaks());
});
afterAll(async () => assertNoLeaks(await findFileLeaks()));
