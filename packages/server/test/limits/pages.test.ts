import { expect, it } from 'vitest';
import { MAX_PAGE_BYTES } from '../../src/http/paging.js';
import { startTestServer, type TestServer } from '../helpers.js';

/**
 * Inserts `count` finished runs for a tenant straight into the table (admission would take far
 * longer), `created_at` in order with three runs sharing each millisecond, so the cursor's
 * tie-break on the id is exercised. Returns their ids, oldest first.
 */
async function insertRuns(
  t: TestServer,
  tenant: string,
  count: number,
  fill: { inputChars?: number; metadata?: Record<string, string> } = {},
): Promise<string[]> {
  const rows = await t.server.store.db.query<{ id: string; at: number }>(
    `INSERT INTO agent_runs (id, tenant, project, user_id, agent, class, mode, status, input, output, metadata,
       created_at, started_at, finished_at)
     SELECT 'run_' || substr(md5($1::text || g), 1, 24), $1::text, 'p', 'u', 'echo', 'default', 'queued', 'succeeded',
       to_jsonb(repeat('x', $3::int)), jsonb_build_object('text', repeat('y', $3::int)), $4::jsonb,
       c, c, c
     FROM generate_series(1, $2::int) g,
          LATERAL (SELECT timestamptz '2030-01-01' + (g / 3) * interval '1 millisecond' AS c) t
     RETURNING id, (extract(epoch FROM created_at) * 1000)::float8 AS at`,
    [tenant, count, fill.inputChars ?? 1, JSON.stringify(fill.metadata ?? {})],
  );
  // The order of the list: creation time, then id.
  return rows.rows.sort((a, b) => a.at - b.at || (a.id < b.id ? -1 : 1)).map((r) => r.id);
}

/** Every page of a tenant's runs from the start: the ids in order, and each page's size in bytes. */
async function allPages(t: TestServer, token: string, query = 'limit=1000') {
  const ids: string[] = [];
  const pages: { bytes: number; items: number; hasMore: boolean }[] = [];
  let cursor: string | null = null;
  do {
    const r = await fetch(
      `${t.server.url}/api/client/v1/agents/runs?${query}${cursor ? `&cursor=${cursor}` : ''}`,
      { headers: { authorization: `Bearer ${token}` } },
    );
    expect(r.status).toBe(200);
    const raw = Buffer.from(await r.arrayBuffer());
    const page = JSON.parse(raw.toString('utf8')) as {
      data: { id: string }[];
      has_more: boolean;
      next_cursor: string | null;
    };
    ids.push(...page.data.map((run) => run.id));
    pages.push({ bytes: raw.length, items: page.data.length, hasMore: page.has_more });
    expect(page.next_cursor === null).toBe(!page.has_more);
    cursor = page.next_cursor;
  } while (cursor !== null && pages.length < 100);
  return { ids, pages };
}

it('H4: list items carry no input or output, so a page of 1,000 runs holding 2 GB of them stays small; GET of one run has them', async () => {
  const t = await startTestServer();
  const token = await t.token({ tenant: 'big', role: 'read' });
  // A megabyte of input and one of output per run.
  const ids = await insertRuns(t, 'big', 1000, { inputChars: 1_000_000 });
  const { ids: listed, pages } = await allPages(t, token);
  expect(pages).toHaveLength(1);
  expect(pages[0]!.items).toBe(1000);
  expect(pages[0]!.bytes).toBeLessThan(1_000_000);
  expect(listed).toEqual(ids);

  const page = await t.call('GET', '/agents/runs?limit=3', undefined, token);
  for (const item of page.body.data) {
    expect(item).not.toHaveProperty('input');
    expect(item).not.toHaveProperty('output');
    expect(item).toMatchObject({ object: 'agent.run', status: 'succeeded' });
  }
  const one = await t.call('GET', `/agents/runs/${ids[7]}`, undefined, token);
  expect(one.status).toBe(200);
  expect((one.body.input as string).length).toBe(1_000_000);
  expect((one.body.output.text as string).length).toBe(1_000_000);
}, 120_000);

it('H4: a page is also cut by size in bytes (MAX_PAGE_BYTES): large metadata gives has_more and a cursor that reaches every run once', async () => {
  const t = await startTestServer();
  const token = await t.token({ tenant: 'wide', role: 'read' });
  // The most metadata the API takes (16 keys, 512-character values), in a three-byte character:
  // about 25 KB of JSON per run, 25 MB for the thousand.
  const metadata = Object.fromEntries(
    Array.from({ length: 16 }, (_, i) => [`k${String(i).padStart(63, '0')}`, '€'.repeat(512)]),
  );
  const ids = await insertRuns(t, 'wide', 1000, { metadata });
  const { ids: listed, pages } = await allPages(t, token);
  expect(pages.length).toBeGreaterThanOrEqual(3);
  expect(pages[0]!.hasMore).toBe(true);
  for (const page of pages) {
    // The items stay under the bound; the envelope and the commas add a little.
    expect(page.bytes).toBeLessThanOrEqual(MAX_PAGE_BYTES + 4096);
    expect(page.items).toBeGreaterThan(0);
  }
  expect(listed).toEqual(ids);
}, 120_000);

it("L4: the cursor is opaque and tenant-scoped: another tenant's cursor pages nothing of the first tenant's; a forged cursor is 400", async () => {
  const t = await startTestServer();
  const first = await t.token({ tenant: 'first', role: 'read' });
  const second = await t.token({ tenant: 'second', role: 'read' });
  const mine = await insertRuns(t, 'first', 9);
  const theirs = await insertRuns(t, 'second', 9);

  const page = await t.call('GET', '/agents/runs?limit=2', undefined, first);
  expect(page.body.data.map((r: { id: string }) => r.id)).toEqual(mine.slice(0, 2));
  const cursor = page.body.next_cursor as string;
  // Nothing readable in it: no run id, no counter.
  expect(cursor).not.toContain(mine[1]);
  expect(cursor).toMatch(/^[A-Za-z0-9_-]+$/);
  expect(cursor).not.toMatch(/^\d+$/);

  const borrowed = await allPages(t, second, `limit=1000&cursor=${cursor}`);
  expect(borrowed.ids.every((id) => theirs.includes(id))).toBe(true);
  expect(borrowed.ids.some((id) => mine.includes(id))).toBe(false);
  // The owner's own next page goes on where it stopped.
  expect((await allPages(t, first, `limit=1000&cursor=${cursor}`)).ids).toEqual(mine.slice(2));

  const forged = [
    'not a cursor',
    Buffer.from('12:run_x;drop table').toString('base64url'),
    Buffer.from('1'.repeat(30) + ':run_x').toString('base64url'),
    Buffer.from(`-1:${mine[0]}`).toString('base64url'),
    '%00',
    'x'.repeat(300),
  ];
  for (const bad of forged) {
    const r = await t.call('GET', `/agents/runs?cursor=${encodeURIComponent(bad)}`, undefined, first);
    expect(r.status, bad).toBe(400);
    expect(r.body.error).toMatchObject({ type: 'invalid_request', param: 'cursor' });
  }
}, 60_000);
