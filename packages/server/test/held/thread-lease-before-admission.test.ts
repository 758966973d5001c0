import pg from 'pg';
import { expect, it } from 'vitest';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, freshDatabase, lastUserText, postgres, startTestServer, until } from '../helpers.js';
import { gate } from '../process/harness.js';
import { describeWith } from '../../../../scripts/service-suites.js';

/**
 * A held run takes its thread (a lease of 3 x nodeStaleMs, threads/store.ts threadLeaseMs)
 * before it is admitted (routes/create-run.ts). Nothing renews that lease until the run
 * executes (node/upkeep.ts renews only `executor.executing()`), and admission never checks
 * the lock is still its own. An admission slower than the lease (the tenant's lock held by a
 * slow admission, a long line of admissions in `inTurn`) lets a second run take the thread
 * meanwhile: both are admitted and both run on one thread at once.
 */
describeWith({ PostgreSQL: postgres })('the thread lease of a run waiting for admission', () => {
  it('a thread lease that ran out while its run waited for admission does not let two runs hold the thread', async () => {
    const release = gate();
    const provider = await startProviderStandIn({
      reply: async (r) => {
        await release.promise;
        return { text: `done ${lastUserText(r)}` };
      },
    });
    afterThisTest(async () => {
      release.open();
      await provider.close();
    });
    const databaseUrl = await freshDatabase();
    // A lease of 1.5 s; admission waits are bounded by the 15 s statement timeout.
    const t = await startTestServer({ provider, databaseUrl, settings: { nodeStaleMs: 500 } });
    const thread = (await t.call('POST', '/threads')).body.id as string;

    const blocker = new pg.Client({ connectionString: databaseUrl });
    await blocker.connect();
    afterThisTest(() => blocker.end());
    await blocker.query(`SELECT pg_advisory_lock(hashtext('sluice:tenant:t'))`);
    const waitingForAdmission = async () =>
      (
        await blocker.query<{ n: number }>(
          `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
        )
      ).rows[0]!.n;

    const a = t.call('POST', '/agents/echo/runs', { input: 'A', thread_id: thread });
    await until(
      async () => (await waitingForAdmission()) === 1,
      'A waiting for admission, holding the thread',
    );
    await until(
      async () =>
        (
          await blocker.query<{ out: boolean }>(
            `SELECT lock_expires_at < clock_timestamp() AS out FROM threads WHERE id = $1`,
            [thread],
          )
        ).rows[0]!.out,
      "A's thread lease running out",
    );
    const b = t.call('POST', '/agents/echo/runs', { input: 'B', thread_id: thread });
    await until(
      async () => (await waitingForAdmission()) === 2 || t.server.waiters.size === 1,
      'B waiting, for admission or for the thread',
    );
    await blocker.query(`SELECT pg_advisory_unlock(hashtext('sluice:tenant:t'))`);

    // A lost its thread while it waited for admission: admission refuses it (409 thread_busy)
    // instead of letting it run beside B, which holds the thread now.
    const answerA = await a;
    expect(answerA.status).toBe(409);
    expect(answerA.body.error).toMatchObject({ code: 'thread_busy', thread_id: thread });
    await until(() => provider.inFlight === 1, 'B at the provider');
    release.open();
    expect((await b).body.status).toBe('succeeded');
    expect(provider.peakInFlight).toBe(1);
  });
});
