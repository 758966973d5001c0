import type { Database } from '@sluice/postgres/database';
import { afterEach, expect, it, vi } from 'vitest';
import { ADMISSIONS_PER_TENANT, inTurn } from '../../src/runs/turns.js';

/** A body that runs until the test ends it; `started` says whether its turn came. */
function job() {
  let end!: () => void;
  const done = new Promise<void>((resolve) => (end = resolve));
  const j = {
    started: false,
    end,
    body: async () => {
      j.started = true;
      await done;
      return 'ok';
    },
  };
  return j;
}

/** Lets resolved promises run their continuations. */
const settle = () => vi.advanceTimersByTimeAsync(0);

afterEach(() => void vi.useRealTimers());

it('M9: a tenant takes ADMISSIONS_PER_TENANT turns at once in a process, first come first served; other tenants are not held', async () => {
  vi.useFakeTimers();
  const db = {} as Database;
  const jobs = Array.from({ length: 5 }, job);
  const results = jobs.map((j) => inTurn(db, 'a', 1000, j.body));
  const other = job();
  const otherResult = inTurn(db, 'b', 1000, other.body);
  await settle();
  expect(jobs.map((j) => j.started)).toEqual([true, true, false, false, false]);
  expect(ADMISSIONS_PER_TENANT).toBe(2);
  expect(other.started).toBe(true);
  jobs[1]!.end();
  await settle();
  expect(jobs.map((j) => j.started)).toEqual([true, true, true, false, false]);
  for (const j of jobs) j.end();
  other.end();
  expect(await Promise.all([...results, otherResult])).toEqual(Array(6).fill('ok'));
});

it('M9: a line that moves is waited out however long it is; one stuck for the wait time gives up as a lock timeout (55P03)', async () => {
  vi.useFakeTimers();
  const db = {} as Database;
  const jobs = Array.from({ length: 5 }, job);
  const results = jobs.map((j) => inTurn(db, 'a', 1000, j.body));
  // One turn ends every 600 ms: the last caller waits 1,800 ms, past the wait time, and gets its turn.
  for (const j of jobs.slice(0, 3)) {
    await vi.advanceTimersByTimeAsync(600);
    j.end();
    await settle();
  }
  expect(jobs.map((j) => j.started)).toEqual([true, true, true, true, true]);
  // A turn that ends counts as the line moving: a newcomer that waited 999 ms gets the freed turn.
  const late = inTurn(db, 'a', 1000, async () => 'late');
  await vi.advanceTimersByTimeAsync(999);
  jobs[3]!.end();
  expect(await late).toBe('late');
  // Then nothing moves: both turns are held, and a newcomer gives up after the wait time.
  const hanging = job();
  const hangingResult = inTurn(db, 'a', 1000, hanging.body);
  let outcome: string | undefined;
  const stuck = inTurn(db, 'a', 1000, async () => 'never').catch((e: { code?: string }) => e.code);
  void stuck.then((o) => (outcome = o));
  await vi.advanceTimersByTimeAsync(999);
  expect(outcome).toBeUndefined();
  await vi.advanceTimersByTimeAsync(1);
  expect(await stuck).toBe('55P03');
  // The ones holding turns are not touched.
  expect(hanging.started).toBe(true);
  hanging.end();
  expect(await hangingResult).toBe('ok');
  jobs[4]!.end();
  expect(await Promise.all(results)).toEqual(Array(5).fill('ok'));
});
