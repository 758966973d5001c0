import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { expect, inject, it } from 'vitest';
import { installedPgBouncer, startPgBouncer } from '../../../../scripts/pgbouncer.js';
import { describeWith } from '../../../../scripts/service-suites.js';
import { openStore, type Store } from '../../src/store/store.js';
import {
  afterThisTest,
  databaseNameOf,
  freshDatabase,
  postgres,
  throughPgBouncer,
} from '../harness/index.js';

// Found by the soak: behind PgBouncer in transaction mode the server never started, because its
// timeouts went in the startup packet, which PgBouncer refuses.

const pgbouncer = inject('pgbouncer');

const settingsOf = (store: Store) =>
  store.db.transaction(
    async (tx) =>
      (
        await tx.query<{ lock: string; statement: string }>(
          "SELECT current_setting('lock_timeout') AS lock, current_setting('statement_timeout') AS statement",
        )
      ).rows[0],
  );

async function open(databaseUrl: string, notices: string[]): Promise<Store> {
  const store = await openStore({
    databaseUrl,
    dataDir: '/nonexistent',
    statementTimeoutMs: 300,
    onNotice: (message) => notices.push(message),
  });
  afterThisTest(() => store.close());
  return store;
}

describeWith({ PostgreSQL: postgres, PgBouncer: pgbouncer })(
  'the store behind PgBouncer in transaction mode',
  () => {
    it('opens, says where its timeouts went, and bounds a lock wait in every transaction', async () => {
      const direct = await freshDatabase();
      const behind = throughPgBouncer(pgbouncer!, direct);
      const notices: string[] = [];
      const store = await open(behind, notices);
      expect(notices).toEqual([expect.stringMatching(/unsupported startup parameter: statement_timeout/)]);
      expect(await settingsOf(store)).toEqual({ lock: '300ms', statement: '300ms' });

      // Another session holds the lock: the store's transaction gives up after its lock_timeout
      // instead of queueing behind it for as long as the holder likes.
      const holder = new pg.Client({ connectionString: direct });
      await holder.connect();
      afterThisTest(() => holder.end());
      await holder.query('BEGIN');
      await holder.query('SELECT pg_advisory_xact_lock(4242)');
      // Both timeouts are 300 ms: whichever PostgreSQL checks first ends the wait.
      const waited = store.db.transaction((tx) => tx.query('SELECT pg_advisory_xact_lock(4242)'));
      await expect(waited).rejects.toSatisfy((error: { code?: string }) =>
        ['55P03', '57014'].includes(error.code ?? ''),
      );
      await holder.query('ROLLBACK');
    });

    it('a pooler that accepts settings at connect and drops them is found out, and each transaction sets the timeouts', async () => {
      // PgBouncer's ignore_startup_parameters, the usual answer to its refusal above: the store
      // connected without a word, and no statement or lock wait of it was bounded.
      const binary = installedPgBouncer();
      if (!binary) throw new Error('pgbouncer is not installed where Debian puts it');
      const dir = mkdtempSync(join(tmpdir(), 'sluice-pgbouncer-'));
      chmodSync(dir, 0o755);
      const direct = await freshDatabase();
      const lenient = await startPgBouncer(binary, postgres!, databaseNameOf(direct), dir, [
        'statement_timeout',
        'lock_timeout',
        'idle_in_transaction_session_timeout',
      ]);
      afterThisTest(async () => {
        await lenient.stop();
        rmSync(dir, { recursive: true, force: true });
      });
      const behind = throughPgBouncer(lenient.config, direct);
      const notices: string[] = [];
      const store = await open(behind, notices);
      expect(notices).toEqual([
        expect.stringMatching(/accepted settings at connect time but did not apply them/),
      ]);
      expect(await settingsOf(store)).toEqual({ lock: '300ms', statement: '300ms' });
    });

    it('straight to PostgreSQL keeps the timeouts on the session, single statements included', async () => {
      const notices: string[] = [];
      const store = await open(await freshDatabase(), notices);
      expect(notices).toEqual([]);
      const { rows } = await store.db.query<{ statement: string }>(
        "SELECT current_setting('statement_timeout') AS statement",
      );
      expect(rows[0]!.statement).toBe('300ms');
      expect(await settingsOf(store)).toEqual({ lock: '300ms', statement: '300ms' });
    });
  },
);
