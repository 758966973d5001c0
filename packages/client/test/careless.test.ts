import { describe, expect, it } from 'vitest';
import { createClient, type StreamEvent } from '@sluice/client';
import { startTestServer, until } from '../../server/test/helpers.js';

// What a careless caller does, against the real server.

describe('@sluice/client used carelessly, against the run server', () => {
  it('a baseUrl with a trailing slash works; an id of "", "." or ".." is a TypeError, not a request to another route', async () => {
    const t = await startTestServer();
    const sluice = createClient({ baseUrl: `${t.server.url}/`, token: t.admin });
    const created = await sluice.runs.create('echo', { input: 'hello' });
    expect(await sluice.runs.get(created.id)).toMatchObject({ id: created.id, status: 'succeeded' });
    // What `runs.get('..')` asked for before: the URL resolves the segment away, to another route.
    const other = await fetch(`${t.server.url}/api/client/v1/agents/runs/..`, {
      headers: { authorization: `Bearer ${t.admin}` },
    });
    expect(other.url).toBe(`${t.server.url}/api/client/v1/agents/`);
    expect(other.status).toBe(404);
    for (const id of ['', '.', '..']) await expect(sluice.runs.get(id)).rejects.toThrow(TypeError);
  });

  it('runs.wait on a run that does not end, with a signal: the abort ends the held call at once with its reason', async () => {
    const t = await startTestServer();
    const sluice = createClient({ baseUrl: t.server.url, token: t.admin });
    const stalled = await sluice.runs.create('echo', { input: 'stall', wait: false });
    await until(async () => (await sluice.runs.get(stalled.id)).status === 'running', 'the run running');
    const controller = new AbortController();
    const reason = new Error('no more waiting');
    const waiting = sluice.runs.wait(stalled.id, { signal: controller.signal });
    controller.abort(reason);
    await expect(waiting).rejects.toBe(reason);
    expect((await sluice.runs.cancel(stalled.id)).id).toBe(stalled.id);
  });

  it('runs.stream of a run that does not end, aborted after its start: rejects with the reason; the run goes on and can be read again', async () => {
    const t = await startTestServer();
    const sluice = createClient({ baseUrl: t.server.url, token: t.admin });
    const controller = new AbortController();
    const reason = new Error('tab closed');
    const seen: StreamEvent[] = [];
    const reading = (async () => {
      for await (const e of sluice.runs.stream('echo', { input: 'stall' }, { signal: controller.signal })) {
        seen.push(e);
        if (e.event === 'run.started') controller.abort(reason);
      }
    })();
    await expect(reading).rejects.toBe(reason);
    expect(seen.map((e) => e.event)).toEqual(['run.created', 'run.started']);
    const runId = (seen[0]!.data as { id: string }).id;
    expect((await sluice.runs.get(runId)).status).toBe('running');
    // Read again from the start, ending with the cancel.
    const again: StreamEvent[] = [];
    const rereading = (async () => {
      for await (const e of sluice.runs.events(runId)) {
        again.push(e);
        if (e.event === 'run.started') await sluice.runs.cancel(runId);
      }
    })();
    await rereading;
    expect(again.map((e) => e.event)).toEqual(['run.created', 'run.started', 'run.canceled']);
  });
});
