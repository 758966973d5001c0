import { beforeAll, describe, expect, it } from 'vitest';
import { rawExchange } from '../http/raw-client.js';
import { startTestServer, type TestServer } from '../helpers.js';
import { BOUNDARY, PNG, closing, part, sha256, streamUpload, upload, uploadHead } from './upload-client.js';

const MiB = 1024 * 1024;
const portOf = (t: TestServer) => Number(new URL(t.server.url).port);

/** The number of files a tenant has stored, straight from the database. */
async function storedFiles(t: TestServer, tenant: string): Promise<number> {
  const rows = await t.server.store.db.query<{ n: number }>(
    'SELECT count(*)::int AS n FROM files WHERE tenant = $1::text',
    [tenant],
  );
  return rows.rows[0]!.n;
}

let tenants = 0;
/** A tenant of its own for each test, so the tests of a file share one server. */
async function tenantOf(t: TestServer): Promise<{ tenant: string; token: string }> {
  const tenant = `tenant-${++tenants}`;
  return { tenant, token: await t.token({ tenant }) };
}

describe.each(['postgres', 'pglite'] as const)('files on %s', (database) => {
  let t: TestServer;
  beforeAll(async () => {
    t = await startTestServer({ database });
  });

  it('uploads, reads the metadata and the bytes back with their type, deletes; then all three are 404', async () => {
    const { tenant, token } = await tenantOf(t);
    const before = Math.floor(Date.now() / 1000);
    const up = await upload(t.server.url, token, PNG);
    expect(up.status).toBe(201);
    expect(up.body).toEqual({
      id: expect.stringMatching(/^file_[0-9a-f]{24}$/),
      object: 'file',
      bytes: PNG.length,
      mime_type: 'image/png',
      created_at: expect.any(Number),
    });
    expect(up.body.created_at).toBeGreaterThanOrEqual(before - 1);
    const id = String(up.body.id);
    expect((await t.call('GET', `/files/${id}`, undefined, token)).body).toEqual(up.body);

    const content = await fetch(`${t.server.url}/api/client/v1/files/${id}/content`, {
      headers: { authorization: `Bearer ${token}` },
    });
    expect(content.status).toBe(200);
    expect(content.headers.get('content-type')).toBe('image/png');
    expect(content.headers.get('x-content-type-options')).toBe('nosniff');
    expect(sha256(Buffer.from(await content.arrayBuffer()))).toBe(sha256(PNG));

    expect((await t.call('DELETE', `/files/${id}`, undefined, token)).body).toEqual({
      id,
      object: 'file',
      deleted: true,
    });
    for (const path of [`/files/${id}`, `/files/${id}/content`]) {
      expect((await t.call('GET', path, undefined, token)).status).toBe(404);
    }
    expect((await t.call('DELETE', `/files/${id}`, undefined, token)).status).toBe(404);
    expect(await storedFiles(t, tenant)).toBe(0);
  });

  it("another tenant's file is 404 on every route, and stays there", async () => {
    const owner = await tenantOf(t);
    const id = String((await upload(t.server.url, owner.token, PNG)).body.id);
    const other = await tenantOf(t);
    for (const [method, path] of [
      ['GET', `/files/${id}`],
      ['GET', `/files/${id}/content`],
      ['DELETE', `/files/${id}`],
    ] as const) {
      const r = await t.call(method, path, undefined, other.token);
      expect(r.status).toBe(404);
      expect(r.body.error).toMatchObject({ type: 'not_found', message: `No file \`${id}\`` });
    }
    expect((await t.call('GET', `/files/${id}`, undefined, owner.token)).status).toBe(200);
    expect(await storedFiles(t, owner.tenant)).toBe(1);
  });

  it('the limit is 25 MB by default: a declared 30 MB is 413 naming 25 MB', async () => {
    const { token } = await tenantOf(t);
    const sent = await streamUpload(portOf(t), uploadHead(token, 30 * MiB), []);
    expect(sent.response?.status).toBe(413);
    expect(JSON.parse(sent.response!.body).error).toMatchObject({ limit_value: 25 * MiB, value: 30 * MiB });
  });
});

describe('upload limits and malformed uploads, MEDIA_MAX_SIZE_MB=1', () => {
  let t: TestServer;
  beforeAll(async () => {
    t = await startTestServer({
      settings: { mediaMaxSizeMb: 1 },
      tenants: { capped: { runs: { limit: 1, per: 'hour' } } },
    });
  });

  it('a file of exactly the limit is taken', async () => {
    const { token } = await tenantOf(t);
    const exact = await upload(t.server.url, token, Buffer.alloc(MiB, 7), {
      type: 'application/octet-stream',
    });
    expect(exact).toMatchObject({ status: 201, body: { bytes: MiB, mime_type: 'application/octet-stream' } });
  });

  it('a declared length over the limit is 413 before the body is read: 1 KB of a promised 30 MB gets it', async () => {
    const { tenant, token } = await tenantOf(t);
    // The client sends the head and 1 KB, never ends its body, and waits: only an answer given
    // without reading the body can reach it, and the server closes the connection after it.
    const sent = await streamUpload(portOf(t), uploadHead(token, 30 * MiB), [
      part('form-data; name="file"; filename="a.png"', Buffer.alloc(1024, 1)),
    ]);
    expect(sent.response?.status).toBe(413);
    expect(JSON.parse(sent.response!.body).error).toEqual({
      type: 'request_too_large',
      code: 'request_too_large',
      message: expect.stringContaining('limit of 1 MB'),
      param: 'file',
      field: 'file',
      limit: 'media_bytes',
      limit_value: MiB,
      value: 30 * MiB,
    });
    expect(sent.response?.headers.connection).toBe('close');
    expect(await storedFiles(t, tenant)).toBe(0);
  });

  it('a chunked body is cut off as soon as the file passes the limit, not read to its end', async () => {
    const { tenant, token } = await tenantOf(t);
    const chunk = (bytes: Buffer) =>
      Buffer.concat([Buffer.from(`${bytes.length.toString(16)}\r\n`), bytes, Buffer.from('\r\n')]);
    const total = 64 * MiB;
    function* body() {
      yield chunk(
        Buffer.from(
          `--${BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big"\r\nContent-Type: image/png\r\n\r\n`,
        ),
      );
      for (let sent = 0; sent < total; sent += 64 * 1024) yield chunk(Buffer.alloc(64 * 1024, 2));
      yield chunk(Buffer.from(`\r\n--${BOUNDARY}--\r\n`));
      yield Buffer.from('0\r\n\r\n');
    }
    const sent = await streamUpload(portOf(t), uploadHead(token, 'chunked'), body());
    expect(sent.response?.status).toBe(413);
    const error = JSON.parse(sent.response!.body).error;
    expect(error).toMatchObject({ type: 'request_too_large', limit: 'media_bytes', limit_value: MiB });
    expect(error.value).toBeGreaterThan(MiB);
    // Answered while the client was still sending: far less than the 64 MB it meant to send.
    expect(sent.finished).toBe(false);
    expect(sent.sentBeforeAnswer).toBeLessThan(total / 2);
    expect(await storedFiles(t, tenant)).toBe(0);
  });

  it('a Content-Length that lies is refused either way, and stores nothing', async () => {
    const { tenant, token } = await tenantOf(t);
    const body = Buffer.concat([part('form-data; name="file"; filename="a.png"', PNG), closing]);
    // Shorter than the body: the multipart ends early, and the bytes after it are no request.
    const short = await rawExchange(portOf(t), Buffer.concat([uploadHead(token, 40), body]));
    expect(short.responses.length).toBeGreaterThan(0);
    expect(short.responses.every((r) => r.status >= 400 && r.status < 500)).toBe(true);
    // Longer than the body: the client stops writing, the body ends short of what was promised.
    const long = await rawExchange(portOf(t), Buffer.concat([uploadHead(token, body.length + 500), body]), {
      halfClose: true,
    });
    expect(long.responses.every((r) => r.status >= 400 && r.status < 500)).toBe(true);
    expect(await storedFiles(t, tenant)).toBe(0);
    expect((await upload(t.server.url, token, PNG)).status).toBe(201);
  });

  const file = (name: string, content: Buffer | string = PNG, type?: string) =>
    Buffer.concat([part(`form-data; name="${name}"; filename="a.png"`, content, type), closing]);
  const cases: [string, Buffer, string | undefined, number, RegExp][] = [
    ['no part at all', closing, undefined, 400, /none/],
    [
      'a text field instead of the file',
      Buffer.concat([part('form-data; name="note"', 'hi', 'text/plain'), closing]),
      undefined,
      400,
      /`note`/,
    ],
    ['a file under another name', file('upload'), undefined, 400, /`upload`/],
    [
      'two file parts',
      Buffer.concat([
        part('form-data; name="file"; filename="a.png"', PNG),
        part('form-data; name="file"; filename="b.png"', PNG),
        closing,
      ]),
      undefined,
      400,
      /one multipart part/,
    ],
    ['`__proto__` as the part name', file('__proto__'), undefined, 400, /prototype/],
    ['a field name of 100,000 characters', file('f'.repeat(100_000)), undefined, 400, /./],
    ['an empty file', file('file', ''), undefined, 400, /empty/],
    ['a part type that is no media type', file('file', PNG, 'not a type'), undefined, 400, /Content-Type/],
    [
      'JSON instead of multipart',
      Buffer.from('{"file":"x"}'),
      'application/json',
      415,
      /multipart\/form-data/,
    ],
    ['multipart without a boundary', Buffer.from('x'), 'multipart/form-data', 400, /malformed/],
  ];

  it.each(cases)('%s: 4xx naming the field', async (_name, body, contentType, status, message) => {
    const { tenant, token } = await tenantOf(t);
    const head = uploadHead(token, body.length, contentType);
    const sent = await rawExchange(portOf(t), Buffer.concat([head, body]), { halfClose: true });
    const first = sent.responses[0];
    expect(first?.status).toBe(status);
    const error = JSON.parse(first!.body).error;
    expect(error.field).toBe('file');
    expect(error.message).toMatch(message);
    expect(await storedFiles(t, tenant)).toBe(0);
    // The server is unharmed: the next upload is taken.
    expect((await upload(t.server.url, token, PNG)).status).toBe(201);
  });

  it('a read token cannot upload; an upload needs a token at all', async () => {
    const read = await t.token({ role: 'read' });
    const raw = Buffer.concat([uploadHead(read, file('file').length), file('file')]);
    expect((await rawExchange(portOf(t), raw, { halfClose: true })).responses[0]?.status).toBe(403);
    const none = (await upload(t.server.url, 'no-such-token', PNG)).status;
    expect(none).toBe(401);
  });

  it('files count toward no run cap: a tenant whose run quota is one uploads three files, then runs its one run', async () => {
    const token = await t.token({ tenant: 'capped' });
    for (let i = 0; i < 3; i++) expect((await upload(t.server.url, token, PNG)).status).toBe(201);
    expect((await t.call('POST', '/agents/echo/runs', { input: 'hi' }, token)).status).toBe(200);
    expect((await t.call('POST', '/agents/echo/runs', { input: 'again' }, token)).status).toBe(429);
    expect((await upload(t.server.url, token, PNG)).status).toBe(201);
  });
});
