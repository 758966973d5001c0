import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { githubHeaders, sendWebhook, standardHeaders, startFileServer, type FileServer } from './harness.js';

/**
 * Webhook triggers over real sockets: who may manage them, what a sender must sign, and that a
 * delivery makes at most one run, whatever copies arrive.
 */

let s: FileServer;
let admin: string;
let member: string;

beforeAll(async () => {
  s = await startFileServer({
    // Tenant `q` may admit one run an hour: its second delivery meets the runs API's 429.
    tenants: { t: { agents: ['echo'] }, q: { runs: { limit: 1, per: 'hour' } } },
  });
  admin = await s.token();
  member = await s.token({ role: 'member' });
});
afterAll(() => s?.close());

async function createTrigger(body: Record<string, unknown>, token = admin) {
  const r = await s.call('POST', '/triggers', token, body);
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body as { id: string; url: string; secret: string; class: string };
}

const runsOf = async (token = admin) =>
  (await s.call('GET', '/agents/runs?limit=1000', token)).body.data as { id: string; input: unknown }[];

describe('managing triggers', () => {
  it('is for admins; the secret is shown once; bad fields are named with their values', async () => {
    const created = await s.call('POST', '/triggers', admin, {
      name: 'gh',
      agent: 'echo',
      class: 'deferred',
    });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({
      object: 'trigger',
      name: 'gh',
      agent: 'echo',
      class: 'deferred',
      schedule: null,
    });
    expect(created.body.secret).toMatch(/^whsec_/);
    expect(created.body.url).toBe(`${s.server.url}/api/client/v1/triggers/${created.body.id}/webhook`);

    const listed = await s.call('GET', '/triggers', admin);
    expect(listed.status).toBe(200);
    const mine = listed.body.data.find((t: { id: string }) => t.id === created.body.id);
    expect(mine).toMatchObject({ name: 'gh', class: 'deferred' });
    expect(JSON.stringify(listed.body)).not.toContain(created.body.secret);

    for (const [method, path] of [
      ['POST', '/triggers'],
      ['GET', '/triggers'],
      ['DELETE', `/triggers/${created.body.id}`],
    ] as const) {
      const r = await s.call(
        method,
        path,
        member,
        method === 'POST' ? { name: 'x', agent: 'echo' } : undefined,
      );
      expect(r.status, `${method} ${path}`).toBe(403);
    }

    const badCron = await s.call('POST', '/triggers', admin, {
      name: 'n',
      agent: 'echo',
      schedule: '61 * * * *',
    });
    expect(badCron.status).toBe(400);
    expect(badCron.body.error).toMatchObject({ param: 'schedule', value: '61 * * * *' });
    expect(badCron.body.error.message).toContain('61');
    const seconds = await s.call('POST', '/triggers', admin, {
      name: 'n',
      agent: 'echo',
      schedule: '* * * * * *',
    });
    expect(seconds.status).toBe(400);
    expect(seconds.body.error.message).toContain('5 fields');
    // `other` exists, but tenant `t` may not run it: the same answer as a name that is nowhere.
    for (const agent of ['other', 'nobody', '__proto__']) {
      const r = await s.call('POST', '/triggers', admin, { name: 'n', agent });
      expect(r.status, agent).toBe(400);
      expect(r.body.error).toMatchObject({ param: 'agent', value: agent });
    }
    const long = await s.call('POST', '/triggers', admin, { name: 'n'.repeat(129), agent: 'echo' });
    expect(long.status).toBe(400);
    expect(long.body.error.param).toBe('name');
    const extra = await s.call('POST', '/triggers', admin, { name: 'n', agent: 'echo', secret: 'mine' });
    expect(extra.status).toBe(400);

    // Another tenant's admin sees none of it and deletes nothing.
    const stranger = await s.token({ tenant: 'q' });
    expect((await s.call('GET', '/triggers', stranger)).body.data).toEqual([]);
    expect((await s.call('DELETE', `/triggers/${created.body.id}`, stranger)).status).toBe(404);

    expect((await s.call('DELETE', `/triggers/${created.body.id}`, admin)).body).toEqual({
      id: created.body.id,
      object: 'trigger',
      deleted: true,
    });
    expect((await s.call('DELETE', `/triggers/${created.body.id}`, admin)).status).toBe(404);
    // A deleted trigger's webhook answers like any unknown one.
    const body = '{"after":"deleted"}';
    const late = await sendWebhook(
      created.body.url,
      body,
      standardHeaders(created.body.secret, 'msg_late', body),
    );
    expect(late.status).toBe(401);
  });
});

describe('webhooks', () => {
  it('a signed delivery queues one run in the trigger class with the body as input', async () => {
    const t = await createTrigger({
      name: 'push',
      agent: 'echo',
      class: 'deferred',
      input: 'Review this push.',
    });
    const body = JSON.stringify({ ref: 'refs/heads/main', commits: [{ id: 'abc' }] });
    const r = await sendWebhook(t.url, body, standardHeaders(t.secret, 'msg_ok_1', body));
    expect(r.status, JSON.stringify(r.body)).toBe(202);
    expect(r.body).toMatchObject({ object: 'agent.run', agent: 'echo', class: 'deferred' });
    expect(['queued', 'running', 'succeeded']).toContain(r.body.status);
    expect(r.body.input).toBe(`Review this push.\n\n${body}`);
    expect(r.body.metadata).toEqual({ trigger_id: t.id });
  });

  it('refuses missing, wrong, stale and future signatures with one 401, and creates nothing', async () => {
    const t = await createTrigger({ name: 'strict', agent: 'echo' });
    const other = await createTrigger({ name: 'other-secret', agent: 'echo' });
    const body = '{"action":"opened"}';
    const now = Math.floor(Date.now() / 1000);
    const before = (await runsOf()).length;
    const attempts: [string, Record<string, string>, string?][] = [
      ['no headers', {}],
      ['another trigger secret', standardHeaders(other.secret, 'msg_a', body)],
      ['body changed after signing', standardHeaders(t.secret, 'msg_b', body), '{"action":"closed"}'],
      ['six minutes old', standardHeaders(t.secret, 'msg_c', body, now - 360)],
      ['six minutes ahead', standardHeaders(t.secret, 'msg_d', body, now + 360)],
      ['id changed after signing', { ...standardHeaders(t.secret, 'msg_e', body), 'webhook-id': 'msg_f' }],
      [
        'signature not base64 of 32 bytes',
        { ...standardHeaders(t.secret, 'msg_g', body), 'webhook-signature': 'v1,AAAA' },
      ],
      ['github signature of another secret', githubHeaders(other.secret, body, 'd1')],
      ['github signature not hex', { 'x-hub-signature-256': 'sha256=zz' }],
      ['github secret used as Standard Webhooks key bytes', githubHeaders(t.secret.slice(6), body, 'd2')],
    ];
    const answers = new Set<string>();
    for (const [what, headers, sent] of attempts) {
      const r = await sendWebhook(t.url, sent ?? body, headers);
      expect(r.status, what).toBe(401);
      answers.add(JSON.stringify(r.body));
    }
    // A made-up trigger id, and a real one with a bad signature: the same answer.
    const unknown = await sendWebhook(
      t.url.replace(t.id, 'trg_000000000000000000000000'),
      body,
      standardHeaders(t.secret, 'msg_h', body),
    );
    expect(unknown.status).toBe(401);
    answers.add(JSON.stringify(unknown.body));
    expect(answers.size).toBe(1);
    expect(JSON.parse([...answers][0]!).error.type).toBe('webhook_signature_invalid');
    // No bearer token makes a webhook pass, and none is needed by a good one.
    const withBearer = await fetch(t.url, {
      method: 'POST',
      headers: { authorization: `Bearer ${admin}`, 'content-type': 'application/json' },
      body,
    });
    expect(withBearer.status).toBe(401);
    expect((await runsOf()).length).toBe(before);
  });

  it('accepts one good signature among several, and a timestamp inside five minutes', async () => {
    const t = await createTrigger({ name: 'rotating', agent: 'echo' });
    const body = '{"n":1}';
    const ts = Math.floor(Date.now() / 1000) - 240;
    const good = standardHeaders(t.secret, 'msg_multi', body, ts)['webhook-signature'];
    const r = await sendWebhook(t.url, body, {
      ...standardHeaders(t.secret, 'msg_multi', body, ts),
      'webhook-signature': `v1,${Buffer.alloc(32, 7).toString('base64')} v2,whatever ${good}`,
    });
    expect(r.status, JSON.stringify(r.body)).toBe(202);
  });

  it('a repeated webhook-id, even many copies at once, makes one run and answers with it', async () => {
    const t = await createTrigger({ name: 'replayed', agent: 'echo', class: 'deferred' });
    const body = '{"event":"once"}';
    const headers = standardHeaders(t.secret, 'msg_replay', body);
    const first = await sendWebhook(t.url, body, headers);
    expect(first.status).toBe(202);
    const again = await sendWebhook(t.url, body, headers);
    expect(again.status).toBe(202);
    expect(again.body.id).toBe(first.body.id);

    const burstHeaders = standardHeaders(t.secret, 'msg_burst', body);
    const burst = await Promise.all(Array.from({ length: 12 }, () => sendWebhook(t.url, body, burstHeaders)));
    expect(burst.map((r) => r.status)).toEqual(Array(12).fill(202));
    expect(new Set(burst.map((r) => r.body.id)).size).toBe(1);
    const made = (await runsOf()).filter(
      (r) => (r as { metadata?: { trigger_id?: string } }).metadata?.trigger_id === t.id,
    );
    expect(made.map((r) => r.id).sort()).toEqual([first.body.id, burst[0]!.body.id].sort());
  });

  it('verifies GitHub signatures over the raw bytes; a repeated X-GitHub-Delivery makes no second run', async () => {
    const t = await createTrigger({ name: 'github', agent: 'echo', class: 'deferred' });
    // Spacing and key order GitHub chose: re-serialising would break the signature.
    const body = '{ "zen":  "Keep it logically awesome.",\n  "hook_id": 1 }';
    const ok = await sendWebhook(t.url, body, githubHeaders(t.secret, body, 'd-1'));
    expect(ok.status, JSON.stringify(ok.body)).toBe(202);
    expect(ok.body.input).toBe(body);
    const redelivered = await sendWebhook(t.url, body, githubHeaders(t.secret, body, 'd-1'));
    expect(redelivered.body.id).toBe(ok.body.id);
    const next = await sendWebhook(t.url, body, githubHeaders(t.secret, body, 'd-2'));
    expect(next.status).toBe(202);
    expect(next.body.id).not.toBe(ok.body.id);
    // A form-encoded body (GitHub's other content type) is taken as its text.
    const form = `payload=${encodeURIComponent('{"a":1}')}`;
    const formed = await sendWebhook(
      t.url,
      form,
      githubHeaders(t.secret, form, 'd-3'),
      'application/x-www-form-urlencoded',
    );
    expect(formed.status).toBe(202);
    expect(formed.body.input).toBe(form);
  });

  it('a body that is not UTF-8 text is refused after its signature is checked', async () => {
    const t = await createTrigger({ name: 'bytes', agent: 'echo' });
    const raw = Buffer.from([0xff, 0xfe, 0x00, 0x41]);
    const id = 'msg_bytes';
    const ts = Math.floor(Date.now() / 1000);
    const { signWebhook } = await import('../../src/callbacks/signing.js');
    const r = await fetch(t.url, {
      method: 'POST',
      headers: {
        'content-type': 'application/octet-stream',
        'webhook-id': id,
        'webhook-timestamp': String(ts),
        'webhook-signature': signWebhook(t.secret, id, ts, raw),
      },
      body: raw,
    });
    expect(r.status).toBe(400);
    expect(((await r.json()) as { error: { param: string } }).error.param).toBe('body');
    // An empty body asks nothing unless the trigger says what to do.
    const empty = await sendWebhook(t.url, '', standardHeaders(t.secret, 'msg_empty', ''));
    expect(empty.status).toBe(400);
    expect(empty.body.error.param).toBe('body');
    const told = await createTrigger({ name: 'ping', agent: 'echo', input: 'Check the site.' });
    const ping = await sendWebhook(told.url, '', standardHeaders(told.secret, 'msg_ping', ''));
    expect(ping.status).toBe(202);
    expect(ping.body.input).toBe('Check the site.');
  });

  it('over a cap the sender gets the runs API 429, and nothing is recorded against a retry', async () => {
    const qAdmin = await s.token({ tenant: 'q' });
    const t = await createTrigger({ name: 'capped', agent: 'echo', class: 'deferred' }, qAdmin);
    const body = '{"n":1}';
    expect((await sendWebhook(t.url, body, standardHeaders(t.secret, 'msg_q1', body))).status).toBe(202);
    const over = await sendWebhook(t.url, body, standardHeaders(t.secret, 'msg_q2', body));
    expect(over.status).toBe(429);
    expect(over.body.error).toMatchObject({ type: 'agent_quota_exceeded', class: 'deferred' });
    expect(over.retryAfter).toBe('60');
    // The refused delivery left no row: the same id is refused again for the cap, not answered
    // with a run it never got.
    const retried = await sendWebhook(t.url, body, standardHeaders(t.secret, 'msg_q2', body));
    expect(retried.status).toBe(429);
    expect((await runsOf(qAdmin)).length).toBe(1);
  });
});
