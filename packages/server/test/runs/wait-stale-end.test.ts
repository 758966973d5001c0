import { expect, it } from 'vitest';
import type { Database } from '@sluice/postgres/database';
import { RunEvents } from '../../src/runs/events.js';
import { getRun } from '../../src/runs/store.js';
import { waitForRun } from '../../src/runs/submission.js';
import { RunWaiters } from '../../src/runs/waiters.js';
import { settingDefaults } from '../../src/settings.js';
import { deferred, openTestStore, until } from '../helpers.js';

// A caller that resumed a paused run waits for it to settle. The NOTIFY of the pause it answered
// can reach a loaded server after the resume: that end is not this run's end, and the caller
// must not be answered 202 with the run still going.
it('an end heard while the run has not settled (a late notification of its pause) does not end the wait', async () => {
  const { db } = await openTestStore();
  await db.query(
    `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input, worker, started_at)
     VALUES ('run_0123456789abcdef01234567', 't', 'p', 'u', 'echo', 'default', 'queued', 'running', '"x"', 'node_a', clock_timestamp())`,
  );
  const run = (await getRun(db, 't', 'run_0123456789abcdef01234567'))!;
  const waiters = new RunWaiters(db, new RunEvents(db));
  const waiting = waitForRun({ db, waiters, settings: settingDefaults }, run, new AbortController().signal);
  await until(() => waiters.size === 1, 'the caller to wait');

  // The stale end: the row still says running.
  waiters.ended('run_0123456789abcdef01234567');
  const next = await Promise.race([
    waiting.then((w) => `answered ${w.kind}, ${w.run.status}`),
    until(() => waiters.size === 1, 'the caller to wait again').then(() => 'waits again'),
  ]);
  expect(next).toBe('waits again');

  await db.query(
    `UPDATE agent_runs SET status = 'succeeded', output = '{"text":"done"}'::jsonb, finished_at = clock_timestamp()
     WHERE id = 'run_0123456789abcdef01234567'`,
  );
  waiters.ended('run_0123456789abcdef01234567');
  const answered = await waiting;
  expect([answered.kind, answered.run.status, answered.run.output]).toEqual([
    'settled',
    'succeeded',
    { text: 'done' },
  ]);
  waiters.closeAll();
});

it("the run's real end heard while the row of a stale end is being read is not missed: a pause answers the caller at once, not at the window's end", async () => {
  const { db } = await openTestStore();
  const id = 'run_0123456789abcdef01234568';
  await db.query(
    `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input, worker, started_at)
     VALUES ($1, 't', 'p', 'u', 'echo', 'default', 'queued', 'running', '"x"', 'node_a', clock_timestamp())`,
    [id],
  );
  // The caller's read of the row is held at a gate once armed (a loaded event loop, a slow database).
  let gate: Promise<void> | undefined;
  const reading = deferred<void>();
  const held: Database = {
    ...db,
    query: (async (text: string, params?: unknown[]) => {
      const result = await db.query(text, params);
      if (gate && /FROM agent_runs WHERE id = \$1/.test(text)) {
        const wait = gate;
        gate = undefined;
        reading.resolve();
        await wait;
      }
      return result;
    }) as Database['query'],
  };
  const run = (await getRun(db, 't', id))!;
  const waiters = new RunWaiters(db, new RunEvents(db));
  let answered: string | undefined;
  // A pause is never found by the waiters' shared look (it looks for final states only): a
  // missed end would leave the caller waiting the whole minute.
  void waitForRun(
    { db: held, waiters, settings: settingDefaults },
    run,
    new AbortController().signal,
    60_000,
  ).then((w) => (answered = `${w.kind}, ${w.run.status}`));
  await until(() => waiters.size === 1, 'the caller to wait');
  const open = deferred<void>();
  gate = open.promise;
  waiters.ended(id); // stale: the row still says running
  await reading.promise; // the caller has read 'running', and its answer is held
  await db.query(`UPDATE agent_runs SET status = 'requires_action' WHERE id = $1`, [id]);
  waiters.ended(id); // the real end, heard while that answer is held
  open.resolve();
  await until(() => answered !== undefined, 'the caller answered');
  expect(answered).toBe('settled, requires_action');
  waiters.closeAll();
});
