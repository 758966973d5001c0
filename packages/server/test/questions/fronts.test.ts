import { HttpAgent } from '@ag-ui/client';
import type { BaseEvent } from '@ag-ui/core';
import { RunFinishedEventSchema } from '@ag-ui/core/schemas';
import OpenAI from 'openai';
import { beforeAll, expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { postgres, until, type Body } from '../helpers.js';
import { openStream } from '../held/sse.js';
import { startQuestionServer, type QuestionServer } from './harness.js';

// A paused run seen through every front: threads, the runs API stream, AG-UI, the OpenAI endpoints.
let s: QuestionServer;
let openai: OpenAI;

const answer = (id: string, text = 'Lisbon') => s.resume(id, { answers: [{ tool_call_id: 'call_q', text }] });

describeWith({ PostgreSQL: postgres })('a paused question on each front', () => {
  beforeAll(async () => {
    s = await startQuestionServer();
    openai = new OpenAI({ baseURL: `${s.server.url}/api/client/v1`, apiKey: s.admin, maxRetries: 0 });
  });

  it('on a thread: the thread requires action, a new run is 409 thread_requires_action at once, and the answered run appends its messages', async () => {
    const thread = (await s.call('POST', '/threads', {})).body.id as string;
    const paused = (
      await s.call('POST', '/agents/concierge/runs', { input: 'ask on a thread', thread_id: thread })
    ).body;
    expect(paused.status).toBe('requires_action');
    expect((await s.call('GET', `/threads/${thread}`)).body.status).toBe('requires_action');
    for (const extra of [{}, { wait: false }, { stream: true }]) {
      const r = await s.call('POST', '/agents/echo/runs', { input: 'hi', thread_id: thread, ...extra });
      expect(r.status).toBe(409);
      expect(r.body.error).toMatchObject({
        code: 'thread_requires_action',
        thread_id: thread,
        active_run_id: paused.id,
      });
    }
    const done = await answer(paused.id as string, 'Paris');
    expect(done.body).toMatchObject({ status: 'succeeded', output: { text: 'One moment. told: Paris' } });
    const messages = (await s.call('GET', `/threads/${thread}/messages`)).body.data as Body[];
    expect(messages.map((m) => [m.role, m.content])).toEqual([
      ['user', 'ask on a thread'],
      ['assistant', 'One moment. told: Paris'],
    ]);
    expect((await s.call('GET', `/threads/${thread}`)).body.status).toBe('idle');
  });

  it('on the runs API stream: the stream ends with run.requires_action carrying the question', async () => {
    const stream = await openStream(`${s.server.url}/api/client/v1/agents/concierge/runs`, s.admin, {
      input: 'ask in a stream',
      stream: true,
    });
    expect(stream.status).toBe(200);
    const events = await stream.rest();
    expect(events.map((e) => e.event).filter((n) => n !== 'message.delta')).toEqual([
      'run.created',
      'run.started',
      'run.requires_action',
    ]);
    const last = events.at(-1)!.data as Body;
    expect(last).toMatchObject({
      status: 'requires_action',
      required_action: { type: 'answer_question', tool_call_id: 'call_q', question: 'Which city?' },
    });
    expect((await answer(last.id as string)).body.status).toBe('succeeded');
  });

  it('on AG-UI: the run ends with RUN_FINISHED and an interrupt outcome the real client accepts, not RUN_ERROR', async () => {
    const agent = new HttpAgent({
      url: `${s.server.url}/api/client/v1/agents/concierge/ag-ui`,
      headers: { Authorization: `Bearer ${s.admin}` },
      threadId: 'agui-question',
      initialMessages: [{ id: 'm1', role: 'user', content: 'ask via ag-ui' }],
    });
    const events: BaseEvent[] = [];
    await agent.runAgent({ runId: 'agui-run-1' }, { onEvent: ({ event }) => void events.push(event) });
    expect(events.map((e) => e.type)).not.toContain('RUN_ERROR');
    const last = events.at(-1) as unknown as Body;
    // Valid under @ag-ui/core 1.0.0's own schema, which keeps the outcome (it strips one it does not know).
    expect(RunFinishedEventSchema.parse(last).outcome).toEqual(last.outcome);
    expect(last).toMatchObject({
      type: 'RUN_FINISHED',
      threadId: 'agui-question',
      runId: 'agui-run-1',
      outcome: {
        type: 'interrupt',
        interrupts: [
          {
            id: 'call_q',
            reason: 'question',
            message: 'Which city?',
            toolCallId: 'call_q',
            metadata: { name: 'ask_human' },
          },
        ],
      },
    });
    const runId = last.outcome.interrupts[0].metadata.run_id as string;
    expect(last.result).toMatchObject({ run_id: runId, required_action: { type: 'answer_question' } });
    expect((await answer(runId)).body).toMatchObject({
      status: 'succeeded',
      output: { text: 'One moment. told: Lisbon' },
    });
  });

  it('on /responses: a paused response is incomplete with the reason (created, retrieved and streamed), and completed once answered', async () => {
    const created = await openai.responses.create({ model: 'agent:concierge', input: 'ask a response' });
    expect(created.status).toBe('incomplete');
    expect(created.incomplete_details).toEqual({ reason: 'requires_action' });
    expect((created as unknown as Body).required_action).toMatchObject({
      type: 'answer_question',
      tool_call_id: 'call_q',
    });
    expect((await openai.responses.retrieve(created.id)).status).toBe('incomplete');
    await answer(created.id);
    const after = await openai.responses.retrieve(created.id);
    expect([after.status, after.output_text, after.incomplete_details]).toEqual([
      'completed',
      'One moment. told: Lisbon',
      null,
    ]);

    const stream = await openai.responses.create({
      model: 'agent:concierge',
      input: 'ask a streamed response',
      stream: true,
    });
    const types: string[] = [];
    let final: Body | undefined;
    for await (const event of stream) {
      types.push(event.type);
      if (event.type === 'response.incomplete') final = event.response as unknown as Body;
    }
    expect(types.at(-1)).toBe('response.incomplete');
    expect(final).toMatchObject({ status: 'incomplete', incomplete_details: { reason: 'requires_action' } });
    expect((await answer(final!.id as string)).body.status).toBe('succeeded');
  });

  it('on /chat/completions: a paused completion is a 409 run_requires_action naming the run (not retried); streamed, the error ends the stream', async () => {
    const error = await openai.chat.completions
      .create({ model: 'agent:concierge', messages: [{ role: 'user', content: 'ask a chat' }] })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(OpenAI.ConflictError);
    const conflict = error as InstanceType<typeof OpenAI.ConflictError>;
    expect(conflict.code).toBe('run_requires_action');
    expect(conflict.headers.get('x-should-retry')).toBe('false');
    const body = conflict.error as Body;
    expect(body.required_action).toMatchObject({ type: 'answer_question', question: 'Which city?' });
    expect((await answer(body.run_id as string)).body.output.text).toBe('One moment. told: Lisbon');

    const stream = await openai.chat.completions.create({
      model: 'agent:concierge',
      messages: [{ role: 'user', content: 'ask a streamed chat' }],
      stream: true,
    });
    const failure = await (async () => {
      for await (const chunk of stream) void chunk;
    })().catch((e: unknown) => e);
    expect(failure).toBeInstanceOf(OpenAI.APIError);
    const streamed = (failure as InstanceType<typeof OpenAI.APIError>).error as Body;
    expect(streamed).toMatchObject({ code: 'run_requires_action' });
    expect((await answer(streamed.run_id as string)).body.status).toBe('succeeded');
  });

  it('a paused run is canceled from the OpenAI side too: a background response cancels while it waits', async () => {
    const created = await openai.responses.create({
      model: 'agent:concierge',
      input: 'ask in the background',
      background: true,
    });
    await until(async () => (await openai.responses.retrieve(created.id)).status === 'incomplete');
    const canceled = await openai.responses.cancel(created.id);
    expect(canceled.status).toBe('cancelled');
    expect((await answer(created.id)).status).toBe(409);
  });
});
