import { expect, it } from 'vitest';
import { RunEvents } from '../../src/runs/events.js';
import { getRun } from '../../src/runs/store.js';
import { waitForRun } from '../../src/runs/submission.js';
import { RunWaiters } from '../../src/runs/waiters.js';
import { settingDefaults } from '../../src/settings.js';
import { openTestStore, until } from '../helpers.js';

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
