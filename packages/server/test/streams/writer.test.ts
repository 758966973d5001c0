import type { Database } from '@sluice/postgres/database';
import { expect, it } from 'vitest';
import { EventWriter } from '../../src/streams/writer.js';
import { deferred, type Deferred } from '../harness/deferred.js';

/**
 * The event writer's hand-over to a run's end (`take`), with a database whose writes the test
 * answers by hand: nothing here waits for time.
 */

/** A database whose every statement waits until the test answers it. */
function heldDatabase() {
  const writes: { runIds: string[]; answer: Deferred<{ rows: never[] }> }[] = [];
  const db = {
    query: (_text: string, params?: unknown[]) => {
      const rows = JSON.parse(String(params?.[0])) as { run_id: string }[];
      const answer = deferred<{ rows: never[] }>();
      writes.push({ runIds: rows.map((r) => r.run_id), answer });
      return answer.promise;
    },
  } as unknown as Database;
  return { db, writes };
}

const options = { flushMs: 60_000, flushEvents: 1_000, maxPending: 1_000, log: () => undefined, store: true };

/** Whether `promise` settles before the next turn of the event loop. */
const settlesNow = (promise: Promise<unknown>) =>
  Promise.race([
    promise.then(() => true),
    new Promise<boolean>((resolve) => setImmediate(() => resolve(false))),
  ]);

it("a run's end takes its pending events at once while the write under way holds only other runs' events", async () => {
  const { db, writes } = heldDatabase();
  const writer = new EventWriter(db, options);
  writer.append('run_a', 2, 'message.delta', { text: 'a' });
  const flushed = writer.flush();
  await Promise.resolve();
  expect(writes.map((w) => w.runIds)).toEqual([['run_a']]);
  // run_b's events came after that write began: they are pending, and its end takes them
  // without waiting for run_a's write.
  writer.append('run_b', 2, 'message.delta', { text: 'b' });
  const taken = writer.take('run_b');
  expect(await settlesNow(taken)).toBe(true);
  expect((await taken).map((row) => row.run_id)).toEqual(['run_b']);
  writes[0]!.answer.resolve({ rows: [] });
  await flushed;
  await writer.close();
});

it("a run's end waits for a write under way that holds its earlier events, then takes the rest", async () => {
  const { db, writes } = heldDatabase();
  const writer = new EventWriter(db, options);
  writer.append('run_a', 2, 'run.started', { id: 'run_a' });
  const flushed = writer.flush();
  await Promise.resolve();
  writer.append('run_a', 3, 'message.delta', { text: 'a' });
  const taken = writer.take('run_a');
  // Its event 2 is in the write under way: ending the run before that write commits would let a
  // reader see the end without it.
  expect(await settlesNow(taken)).toBe(false);
  writes[0]!.answer.resolve({ rows: [] });
  await flushed;
  const rows = await taken;
  expect(rows.map((row) => [row.run_id, row.seq])).toEqual([['run_a', 3]]);
  await writer.close();
});

it('a write that fails puts its rows back: the end then takes them all, the earlier first', async () => {
  const { db, writes } = heldDatabase();
  const writer = new EventWriter(db, options);
  writer.append('run_a', 2, 'run.started', { id: 'run_a' });
  const flushed = writer.flush();
  await Promise.resolve();
  writer.append('run_a', 3, 'message.delta', { text: 'a' });
  const taken = writer.take('run_a');
  writes[0]!.answer.reject(new Error('the database is away'));
  await expect(flushed).rejects.toThrow('the database is away');
  const rows = await taken;
  expect(rows.map((row) => row.seq)).toEqual([2, 3]);
  await writer.close();
});

it('a flush whose answer was lost (its rows written after all) loses none of the events that came after it', async () => {
  // A database that keeps rows as the table does (a row whose run and seq are there already is
  // skipped: ON CONFLICT DO NOTHING), and whose first write commits but answers with an error.
  const table = new Map<string, { seq: number; events: unknown[] }>();
  let lost = true;
  const db = {
    query: async (_text: string, params?: unknown[]) => {
      const rows = JSON.parse(String(params?.[0])) as { run_id: string; seq: number; events: unknown[] }[];
      for (const row of rows) {
        const key = `${row.run_id}:${row.seq}`;
        if (!table.has(key)) table.set(key, { seq: row.seq, events: row.events });
      }
      if (lost) {
        lost = false;
        throw new Error('Connection terminated');
      }
      return { rows: [] };
    },
  } as unknown as Database;
  const writer = new EventWriter(db, options);
  writer.append('run_a', 2, 'run.started', { id: 'run_a' });
  await expect(writer.flush()).rejects.toThrow('Connection terminated');
  writer.append('run_a', 3, 'message.delta', { text: 'a' });
  writer.append('run_a', 4, 'message.delta', { text: 'b' });
  await writer.flush();
  const ids = [...table.values()].flatMap((row) => row.events.map((_, i) => row.seq + i)).sort();
  expect(ids).toEqual([2, 3, 4]);
  await writer.close();
});
