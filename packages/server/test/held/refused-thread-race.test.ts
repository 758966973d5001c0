// Two first uses of one thread at once, one of them refused (review R45's other side): the request
// that made the thread removes it when it is refused, and the other request, which found the
// thread made and went on, must not then fail with 404 for a thread id its client never sent. An
// accepted request never fails because another was refused. Over real HTTP, on PostgreSQL.
//
// The interleaving that matters is narrow (the refused request's removal lands after the other
// request read the thread and before its run took the thread's lock), so the test puts it there
// in the database itself: a trigger on the thread's lock removes the thread once, with the same
// statements a refused request's `dropNewThread` runs, as the lock is about to be taken.
import { expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { threadOfAgUi } from '../../src/agui/threads.js';
import { threadOfChain } from '../../src/openai/chains.js';
import type { Principal } from '../../src/store/tokens.js';
import { postgres, startTestServer, until, type TestServer } from '../helpers.js';

const member = (tenant: string): Principal => ({
  tokenId: 'test',
  tenant,
  project: 'p',
  user: 'u',
  role: 'member',
});

/**
 * The first time any thread is about to be locked, it is removed as a refused request that made
 * it removes it (its messages go with it, the response it was seeded from has no thread again),
 * and the lock finds no thread. Returns how many times it fired.
 */
async function refusalLandsBeforeTheLock(t: TestServer): Promise<() => Promise<number>> {
  const { db } = t.server.store;
  await db.query(`CREATE TABLE race_fired (n int NOT NULL)`);
  await db.query(`INSERT INTO race_fired VALUES (0)`);
  await db.query(`CREATE FUNCTION race_drop() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      UPDATE race_fired SET n = n + 1 WHERE n = 0;
      IF NOT FOUND THEN RETURN NEW; END IF;
      DELETE FROM threads WHERE id = OLD.id;
      UPDATE agent_runs SET thread_id = NULL WHERE thread_id = OLD.id;
      RETURN NULL;
    END $$`);
  await db.query(`CREATE TRIGGER race_drop BEFORE UPDATE ON threads FOR EACH ROW
    WHEN (OLD.active_run_id IS NULL AND NEW.active_run_id IS NOT NULL) EXECUTE FUNCTION race_drop()`);
  return async () => (await db.query<{ n: number }>('SELECT n FROM race_fired')).rows[0]!.n;
}

describeWith({ PostgreSQL: postgres })('a request whose thread another refused request removed', () => {
  it('AG-UI: the thread is made again and the run goes on (not 404 thread_missing)', async () => {
    const t = await startTestServer({ database: 'postgres' });
    const token = await t.token({ tenant: 'a', project: 'p', role: 'member' });
    const { db } = t.server.store;
    // Another request's first use made the thread (with its resent history)...
    const made = await threadOfAgUi(db, member('a'), 'client-race', [{ role: 'user', content: 'earlier' }]);
    expect(made.created).toBeDefined();
    const fired = await refusalLandsBeforeTheLock(t);
    // ...and this one found it made; that request's refusal then removes it before this run locks it.
    const reply = await t.call(
      'POST',
      '/agents/echo/ag-ui',
      {
        threadId: 'client-race',
        runId: 'r1',
        messages: [
          { id: 'm1', role: 'user', content: 'before' },
          { id: 'm2', role: 'assistant', content: 'an answer' },
          { id: 'm3', role: 'user', content: 'now' },
        ],
      },
      token,
      { anyBody: true },
    );
    expect(await fired()).toBe(1);
    expect(reply.status).toBe(200);
    expect(reply.text).toContain('RUN_FINISHED');
    // The thread is this request's now: its own history, its turn and the answer.
    const { rows } = await db.query<{ role: string }>(
      'SELECT role FROM thread_messages WHERE thread_id = $1::text ORDER BY seq',
      [made.id],
    );
    expect(rows.map((r) => r.role)).toEqual(['user', 'assistant', 'user', 'assistant']);
  }, 60_000);

  it('Responses: a follow-up whose chain thread was removed makes the chain thread again (inline and streamed)', async () => {
    const t = await startTestServer({ database: 'postgres' });
    const token = await t.token({ tenant: 'a', project: 'p', role: 'member' });
    const { db } = t.server.store;
    for (const stream of [false, true]) {
      const first = await t.call('POST', '/responses', { model: 'agent:echo', input: 'first' }, token);
      expect(first.body).toMatchObject({ status: 'completed' });
      // Another follow-up made the chain's thread...
      const made = await threadOfChain(db, member('a'), first.body.id as string);
      expect(made.created).toBeDefined();
      await db.query('DROP TABLE IF EXISTS race_fired');
      await db.query('DROP TRIGGER IF EXISTS race_drop ON threads');
      await db.query('DROP FUNCTION IF EXISTS race_drop');
      const fired = await refusalLandsBeforeTheLock(t);
      // ...and its refusal removes it after this follow-up read it, before this run locks it.
      const reply = await t.call(
        'POST',
        '/responses',
        { model: 'agent:echo', input: 'more', previous_response_id: first.body.id, stream },
        token,
        { anyBody: true },
      );
      expect(await fired()).toBe(1);
      expect(reply.status).toBe(200);
      if (stream) expect(reply.text).toContain('response.completed');
      else expect(reply.body).toMatchObject({ status: 'completed' });
      // The chain has a thread again, the one this follow-up ran on.
      const { rows } = await db.query<{ thread_id: string | null }>(
        'SELECT thread_id FROM agent_runs WHERE id = $1::text',
        [first.body.id],
      );
      expect(rows[0]!.thread_id).not.toBeNull();
      expect(rows[0]!.thread_id).not.toBe(made.id);
    }
  }, 60_000);

  it('Responses: a background or flex follow-up admitted on a chain thread removed meanwhile is moved to the thread made again, and runs (not queued for ever)', async () => {
    const t = await startTestServer({ database: 'postgres' });
    const token = await t.token({ tenant: 'a', project: 'p', role: 'member' });
    const { db } = t.server.store;
    for (const how of [{ background: true }, { service_tier: 'flex' }]) {
      const first = await t.call('POST', '/responses', { model: 'agent:echo', input: 'first' }, token);
      expect(first.body).toMatchObject({ status: 'completed' });
      // Another follow-up made the chain's thread...
      const made = await threadOfChain(db, member('a'), first.body.id as string);
      expect(made.created).toBeDefined();
      // ...and its refusal removes it while this follow-up's queued run is being admitted on it
      // (its removal did not see the insert): a trigger on the insert does what that removal does.
      await db.query('DROP TRIGGER IF EXISTS race_insert ON agent_runs');
      await db.query('DROP FUNCTION IF EXISTS race_insert');
      await db.query(`CREATE FUNCTION race_insert() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          DELETE FROM threads WHERE id = NEW.thread_id;
          UPDATE agent_runs SET thread_id = NULL WHERE thread_id = NEW.thread_id;
          RETURN NEW;
        END $$`);
      await db.query(`CREATE TRIGGER race_insert BEFORE INSERT ON agent_runs FOR EACH ROW
        WHEN (NEW.thread_id = '${made.id}') EXECUTE FUNCTION race_insert()`);
      const reply = await t.call(
        'POST',
        '/responses',
        { model: 'agent:echo', input: 'more', previous_response_id: first.body.id, ...how },
        token,
      );
      expect([200, 202]).toContain(reply.status);
      const id = reply.body.id as string;
      await until(
        async () => (await t.call('GET', `/responses/${id}`, undefined, token)).body.status === 'completed',
        'the follow-up ran',
      );
      // The run and the chain are on one thread, made again, that exists.
      const { rows } = await db.query<{ id: string; thread_id: string | null; there: boolean }>(
        `SELECT r.id, r.thread_id, EXISTS (SELECT 1 FROM threads t WHERE t.id = r.thread_id) AS there
         FROM agent_runs r WHERE r.id = ANY($1::text[]) ORDER BY r.id = $2::text`,
        [[first.body.id, id], first.body.id],
      );
      expect(rows.map((r) => r.there)).toEqual([true, true]);
      expect(rows[0]!.thread_id).toBe(rows[1]!.thread_id);
      expect(rows[0]!.thread_id).not.toBe(made.id);
    }
  }, 60_000);
});
