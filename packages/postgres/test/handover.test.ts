import { afterEach, expect, it } from 'vitest';
import { fromPgPool } from '@sluice/postgres/database';
import { describeWith } from '../../../scripts/service-suites.js';
import { poolThrough, postgresConfig, startDatabaseProxy, type DatabaseProxy } from './helpers.js';

// A pooled connection handed from one statement to a waiting transaction, while PostgreSQL
// terminates its backend (pg_terminate_backend, a restart) in the very read that ended the
// statement. node-postgres then emits 'error' on a client that the pool has already given to
// the transaction and the transaction has not taken yet: a client nobody listens to, which in
// Node ends the process (a CI run of the server's pg_terminate_backend test saw it).
let proxy: DatabaseProxy | undefined;
afterEach(async () => {
  await proxy?.close();
  proxy = undefined;
});

describeWith({ PostgreSQL: postgresConfig })(
  'a connection terminated as it is handed to a transaction',
  () => {
    it('fails that transaction and leaves the process and the pool standing', async () => {
      proxy = await startDatabaseProxy();
      const pool = poolThrough(proxy, 1);
      const db = fromPgPool(pool);
      const uncaught: unknown[] = [];
      const record = (error: unknown) => uncaught.push(error);
      process.on('uncaughtException', record);
      try {
        await pool.query('SELECT 1');
        // The pool's one connection answers a statement while a transaction waits for it.
        proxy.terminateAfterNextAnswer();
        const statement = pool.query('SELECT 2 AS n');
        const transaction = db.transaction((tx) => tx.query('SELECT 3'));
        expect((await statement).rows).toEqual([{ n: 2 }]);
        await expect(transaction).rejects.toThrow();
        expect(uncaught).toEqual([]);
        // A new connection serves what comes next.
        expect((await db.transaction((tx) => tx.query<{ n: number }>('SELECT 4 AS n'))).rows).toEqual([
          { n: 4 },
        ]);
      } finally {
        process.off('uncaughtException', record);
        await pool.end();
      }
    });
  },
);
