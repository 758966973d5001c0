import { connect } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { until } from '../helpers.js';
import { Client, refusedUpgrade, startFileServer, type FileServer } from './harness.js';

let s: FileServer;
beforeAll(async () => {
  s = await startFileServer({ websocket: { maxConnections: 4, maxConnectionsPerUser: 2 } });
});
afterAll(() => s.close());

/** Opens a socket once the server has given back the places of sockets closed just before. */
async function openWhenFree(token: string): Promise<Client> {
  let client: Client | undefined;
  await until(async () => {
    client = await Client.open(s.wsUrl, token).catch(() => undefined);
    return client !== undefined;
  }, 'a free connection place');
  return client!;
}

describe('WebSocket connections', () => {
  it('an upgrade without a valid token is answered 401 before any 101', async () => {
    const none = await refusedUpgrade(s.wsUrl);
    expect(none.status).toBe(401);
    expect(none.body.error).toMatchObject({
      type: 'authentication_required',
      code: 'authentication_required',
    });
    expect((await refusedUpgrade(`${s.wsUrl}?access_token=nope`)).status).toBe(401);
    expect((await refusedUpgrade(s.wsUrl, { authorization: 'Basic abc' })).status).toBe(401);
  });

  it('a plain GET without an upgrade is 426 in the API error body, and takes no connection place', async () => {
    const token = await s.token('plain');
    for (let i = 0; i < 3; i++) {
      const r = await fetch(`${s.url}/ws`, { headers: { authorization: `Bearer ${token}` } });
      expect(r.status).toBe(426);
      expect(((await r.json()) as { error: object }).error).toMatchObject({ type: 'upgrade_required' });
    }
    // Three plain GETs on one kept-alive connection, yet both of the user's places are free.
    const a = await Client.open(s.wsUrl, token);
    const b = await Client.open(s.wsUrl, token);
    await Promise.all([a.close(), b.close()]);
  });

  it('past websocket.maxConnectionsPerUser the upgrade is answered 429 scope user; a closed socket frees its place', async () => {
    const token = await s.token('one');
    const a = await Client.open(s.wsUrl, token);
    const b = await Client.open(s.wsUrl, token, 'query');
    const refused = await refusedUpgrade(s.wsUrl, { authorization: `Bearer ${token}` });
    expect(refused.status).toBe(429);
    expect(refused.retryAfter).toBe('30');
    expect(refused.body.error).toMatchObject({
      type: 'websocket_connection_limit',
      code: 'websocket_connection_limit',
      limit: 'max_connections_per_user',
      limit_value: 2,
      scope: 'user',
      active: 2,
    });
    // Another user is not affected.
    const other = await Client.open(s.wsUrl, await s.token('another'));
    await a.close();
    const c = await openWhenFree(token);
    await Promise.all([b.close(), c.close(), other.close()]);
  });

  it('past websocket.maxConnections the upgrade is answered 429 scope server, whoever asks', async () => {
    const users = await Promise.all(['w', 'x', 'y', 'z'].map((u) => s.token(u)));
    const open = [
      await openWhenFree(users[0]!),
      await openWhenFree(users[0]!),
      await openWhenFree(users[1]!),
      await openWhenFree(users[1]!),
    ];
    const refused = await refusedUpgrade(s.wsUrl, { authorization: `Bearer ${users[2]}` });
    expect(refused.status).toBe(429);
    expect(refused.body.error).toMatchObject({
      limit: 'max_connections',
      limit_value: 4,
      scope: 'server',
      active: 4,
    });
    await open[0]!.close();
    const next = await openWhenFree(users[3]!);
    await Promise.all([...open.slice(1), next].map((c) => c.close()));
  });

  it('an upgrade request to another route, refused before routing (no Host), is answered and its socket ended', async () => {
    // Found by the HTTP fuzz test: the socket stayed open after the 400, and the server's close waited for it.
    const port = Number(new URL(s.server.url).port);
    const answer = await new Promise<string>((resolve, reject) => {
      const socket = connect(port, '127.0.0.1', () =>
        socket.write('GET /readyz HTTP/1.1\r\nupgrade: websocket\r\nconnection: keep-alive, Upgrade\r\n\r\n'),
      );
      let got = '';
      socket.on('data', (d) => (got += String(d)));
      socket.on('close', () => resolve(got));
      socket.on('error', reject);
    });
    expect(answer).toMatch(/^HTTP\/1\.1 400 /);
  });

  it('an upgrade request to another route, or to /ws without a valid key, gets a 400 in the API error body', async () => {
    // Found by the HTTP fuzz test: the handshake's plain-text 400 answered from any route.
    const port = Number(new URL(s.server.url).port);
    const ask = (path: string, extra: string) =>
      new Promise<string>((resolve, reject) => {
        const socket = connect(port, '127.0.0.1', () =>
          socket.write(
            `GET ${path} HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\n${extra}\r\n`,
          ),
        );
        let got = '';
        socket.on('data', (d) => (got += String(d)));
        socket.on('close', () => resolve(got));
        socket.on('error', reject);
      });
    const body = (answer: string) =>
      JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)) as { error: { param: string } };
    const other = await ask('/readyz', '');
    expect(other).toMatch(/^HTTP\/1\.1 400 /);
    expect(body(other).error.param).toBe('upgrade');
    const noKey = await ask('/api/client/v1/ws', 'sec-websocket-version: 13\r\n');
    expect(body(noKey).error.param).toBe('sec-websocket-key');
  });

  it('300 upgrades killed at once, mid-upgrade or just after it, give back every place: all 4 can be taken again', async () => {
    const token = await s.token('killer');
    const { hostname, port } = new URL(s.wsUrl);
    const request = [
      'GET /api/client/v1/ws HTTP/1.1',
      `Host: ${hostname}:${port}`,
      'Upgrade: websocket',
      'Connection: Upgrade',
      'Sec-WebSocket-Version: 13',
      'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==',
      `Authorization: Bearer ${token}`,
      '',
      '',
    ].join('\r\n');
    await Promise.all(
      Array.from(
        { length: 300 },
        (_, i) =>
          new Promise<void>((resolve) => {
            const socket = connect(Number(port), hostname, () => {
              socket.write(request);
              // Half die before any answer, half once the first bytes of one arrive.
              if (i % 2 === 0) socket.destroy();
              else socket.once('data', () => socket.destroy());
            });
            socket.once('close', () => resolve());
            socket.once('error', () => undefined);
          }),
      ),
    );
    const clients = [
      await openWhenFree(token),
      await openWhenFree(token),
      await openWhenFree(await s.token('killer2')),
      await openWhenFree(await s.token('killer3')),
    ];
    await Promise.all(clients.map((c) => c.close()));
  });

  it('a frame over 10 MB closes the socket with 1009; the places it held are given back', async () => {
    const token = await s.token('big');
    const c = await openWhenFree(token);
    c.send({ type: 'run', request_id: 'huge', agent: 'echo', input: 'x'.repeat(10 * 1024 * 1024) });
    expect((await c.closed).code).toBe(1009);
    const again = await openWhenFree(token);
    await again.close();
  });

  it('while draining: a new upgrade gets 503, an open socket gets the end of its run, then closes with 1001', async () => {
    const token = await s.token('drain');
    const c = await openWhenFree(token);
    c.send({ type: 'run', request_id: 'last', agent: 'echo', input: 'hold:drain' });
    await c.until((f) => f.request_id === 'last' && f.type === 'run.started');
    const draining = s.server.drain();
    await until(async () => (await fetch(`${s.server.url}/readyz`)).status === 503, 'the drain');
    const refused = await refusedUpgrade(s.wsUrl, { authorization: `Bearer ${token}` });
    expect(refused.status).toBe(503);
    expect(refused.body.error.type).toBe('server_draining');
    // A run frame on the open socket is refused now.
    c.send({ type: 'run', request_id: 'late', agent: 'echo', input: 'late' });
    expect((await c.until((f) => f.request_id === 'late')).error).toMatchObject({ type: 'server_draining' });
    s.release('drain');
    expect((await c.request('last')).at(-1)).toMatchObject({ type: 'run.completed' });
    const closedWith = await c.closed;
    expect(closedWith.code).toBe(1001);
    await draining;
  });
});
