import { expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { createAgent, tool } from 'sluice';
import { startProviderStandIn, toolThenAnswer } from '@sluice/testkit';
import { afterThisTest, freshDatabase, postgres, startTcpProxy, startTestServer } from '../helpers.js';
import { gate } from '../process/harness.js';
import { openStream } from '../held/sse.js';
import { getEvents, readEvents } from './sse-get.js';

describeWith({ PostgreSQL: postgres })('a run’s events on two server processes (one PostgreSQL)', () => {
  it('a stream cut by a proxy mid-run resumes on the other process with Last-Event-ID: every event once, in order, live', async () => {
    const toolMayReturn = gate();
    const provider = await startProviderStandIn({
      reply: toolThenAnswer(
        () => [{ name: 'lookup', arguments: { q: 'x' } }],
        (results) => `found ${results.join(',')}, and then a long answer that takes several chunks to stream`,
      ),
    });
    afterThisTest(() => provider.close());
    const agents = (model: Parameters<typeof createAgent>[0]['model']) => ({
      researcher: createAgent({
        model,
        credentials: { apiKey: 'k' },
        tools: [
          tool<{ q: string }>({
            name: 'lookup',
            description: 'Look something up',
            parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] },
            execute: async ({ q }) => {
              await toolMayReturn.promise;
              return `result-${q}`;
            },
          }),
        ],
      }),
    });
    const databaseUrl = await freshDatabase();
    const a = await startTestServer({ provider, databaseUrl, agents });
    const b = await startTestServer({ provider, databaseUrl, agents });
    const token = await a.token({ tenant: 'streams', role: 'member' });
    const { port } = new URL(a.server.url);
    const proxy = await startTcpProxy({ host: '127.0.0.1', port: Number(port) });
    afterThisTest(() => proxy.close());

    // Run on A, read through the proxy, until the run waits in its tool.
    const stream = await openStream(
      `http://127.0.0.1:${proxy.port}/api/client/v1/agents/researcher/runs`,
      token,
      {
        input: 'look',
        stream: true,
      },
    );
    const before: string[] = [];
    let runId = '';
    for (let e = await stream.next(); e; e = await stream.next()) {
      before.push(e.event);
      if (e.event === 'run.created') runId = e.data.id as string;
      if (e.event === 'tool.started') break;
    }
    expect(before).toEqual(['run.created', 'run.started', 'tool.started']);
    proxy.cut();

    // B serves the rest from the store, following the run while A executes it.
    const resumed = await getEvents(b.server.url, token, runId, { lastEventId: '3' });
    expect(resumed.status).toBe(200);
    const rest = readEvents(resumed);
    toolMayReturn.open();
    const after = await rest;
    expect(after[0]).toMatchObject({ id: 4, event: 'tool.completed' });
    expect(after.at(-1)).toMatchObject({ event: 'run.completed', data: { status: 'succeeded' } });
    expect(after.map((e) => e.id)).toEqual(after.map((_, i) => i + 4));
    expect(after.filter((e) => e.event === 'message.delta').length).toBeGreaterThan(1);

    // The whole stream from either process is the one A produced.
    const fromA = await readEvents(await getEvents(a.server.url, token, runId));
    const fromB = await readEvents(await getEvents(b.server.url, token, runId));
    expect(fromB).toEqual(fromA);
    expect(fromA.map((e) => e.event).slice(0, 3)).toEqual(before);
    expect(fromA.slice(3)).toEqual(after);
  });
});
