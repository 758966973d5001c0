import { expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { isStoreUnavailable } from '../../src/http/errors.js';
import { openStore } from '../../src/store/store.js';
import { afterThisTest, freshDatabase, postgres, startDatabaseProxy, throughProxy } from '../helpers.js';

// Found by the soak: a database connection that went silent without a reset (a partition, a
// NAT that forgot it) held each statement sent on it for ever. PostgreSQL's statement timeout
// ends the statement there, but its answer never comes back; the pool's connections hung one
// by one, and the server never answered /readyz 200 again.

/**
 * A store on a fresh database behind a proxy that can stall, its statements bounded at 1 s (the
 * warm-up's 50 ms sleeps must stay well inside it on a loaded machine: at 300 ms one ran past it
 * once in a full CI run).
 */
async function storeBehindProxy(poolSize: number) {
  const proxy = await startDatabaseProxy();
  const store = await openStore({
    databaseUrl: throughProxy(await freshDatabase(), proxy.port),
    dataDir: '/nonexistent',
    statementTimeoutMs: 1000,
    poolSize,
  });
  afterThisTest(() => store.close());
  return { proxy, store };
}

describeWith({ PostgreSQL: postgres })('a stalled database connection', () => {
  it('a statement on a connection gone silent fails soon after the statement timeout, and the next goes through a new connection', async () => {
    // One connection: the next statement can only go through a new one once it is dropped.
    const { proxy, store } = await storeBehindProxy(1);
    await store.db.query('SELECT 1');

    proxy.stall();
    const failed = await store.db.query('SELECT 1').then(
      () => undefined,
      (error: unknown) => error,
    );
    expect(failed).toEqual(expect.objectContaining({ message: expect.stringMatching(/timeout/i) }));
    // A request that meets it is answered 503 store_unavailable, as for a cut connection, not 500.
    expect(isStoreUnavailable(failed)).toBe(true);
    expect((await store.db.query<{ one: number }>('SELECT 1 AS one')).rows).toEqual([{ one: 1 }]);

    // A transaction too: its BEGIN goes unanswered, and the connection is dropped (no ROLLBACK is
    // sent on it: that would wait out the bound again).
    proxy.stall();
    await expect(store.db.transaction((tx) => tx.query('SELECT 1'))).rejects.toThrow(/timeout/i);
    const one = await store.db.transaction((tx) => tx.query<{ one: number }>('SELECT 1 AS one'));
    expect(one.rows).toEqual([{ one: 1 }]);
  }, 60_000);

  it('one statement that met the stall drops the idle connections opened before it: the next statements do not each wait out the bound', async () => {
    const { proxy, store } = await storeBehindProxy(4);
    // Four connections open, all idle again.
    await Promise.all(Array.from({ length: 4 }, () => store.db.query('SELECT pg_sleep(0.05)')));

    proxy.stall();
    await expect(store.db.query('SELECT 1')).rejects.toThrow(/timeout/i);
    // The three others went silent with it. Were they kept, each of these would take one and
    // fail after the bound as the first did.
    const outcomes: string[] = [];
    for (let i = 0; i < 4; i++)
      outcomes.push(
        await store.db.query('SELECT 1').then(
          () => 'answered',
          (error: Error) => error.message,
        ),
      );
    expect(outcomes).toEqual(['answered', 'answered', 'answered', 'answered']);
  }, 60_000);
});
