import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { createAgent } from 'sluice';
import { createToken, defineConfig, serve } from '@sluice/server';
import { startProviderStandIn } from '@sluice/testkit';

it('POSTs the finished run to callback_url, retrying a failed delivery; refuses a bad URL', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'sluice-callback-'));
  const provider = await startProviderStandIn();
  // The receiver fails the first delivery, then accepts.
  const received: { id: string; status: string; output: unknown }[] = [];
  let attempts = 0;
  let delivered!: () => void;
  const done = new Promise<void>((r) => (delivered = r));
  const receiver = createServer((req, res) => {
    let body = '';
    req.on('data', (d: Buffer) => (body += d.toString()));
    req.on('end', () => {
      attempts++;
      if (attempts === 1) return res.writeHead(503).end();
      received.push(JSON.parse(body));
      res.writeHead(204).end();
      delivered();
    });
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', r));
  const model = { api: 'openai-completions' as const, provider: 'stand-in', id: 'm', baseUrl: provider.url };
  const server = await serve({
    config: defineConfig({ agents: { echo: createAgent({ model, credentials: { apiKey: 'k' } }) } }),
    port: 0,
    dataDir: dir,
    databaseUrl: '',
  });
  const token = (await createToken(server.store.db, { tenant: 't', project: 'p', user: 'u', role: 'member' }))
    .secret;
  const post = (body: unknown) =>
    fetch(`${server.url}/api/client/v1/agents/echo/runs`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    }).then(async (r) => ({
      status: r.status,
      body: (await r.json()) as { id: string; error?: { field: string } },
    }));

  const created = await post({
    input: 'call me back',
    wait: false,
    callback_url: `http://127.0.0.1:${(receiver.address() as AddressInfo).port}/hook`,
  });
  expect(created.status).toBe(202);
  await done;
  expect(attempts).toBe(2);
  expect(received).toEqual([
    expect.objectContaining({
      id: created.body.id,
      status: 'succeeded',
      output: { text: 'Echo: call me back' },
    }),
  ]);

  const bad = await post({ input: 'x', callback_url: 'ftp://example' });
  expect(bad.status).toBe(400);
  expect(bad.body.error).toMatchObject({ field: 'callback_url' });

  await server.close();
  await provider.close();
  await new Promise((r) => receiver.close(r));
  rmSync(dir, { recursive: true, force: true });
});
