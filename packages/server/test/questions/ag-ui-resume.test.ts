import { HttpAgent } from '@ag-ui/client';
import type { BaseEvent } from '@ag-ui/core';
import { beforeAll, expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { postgres, type Body } from '../helpers.js';
import { startQuestionServer, type QuestionServer } from './harness.js';

// A run paused on the AG-UI front is answered the AG-UI way: the next run of the thread carries
// `resume` entries (@ag-ui/core 1.0's ResumeEntry), sent by the real HttpAgent; the run goes on
// through the runs API's resume service, and its events stream back as AG-UI events.
let s: QuestionServer;

const url = () => `${s.server.url}/api/client/v1/agents/concierge/ag-ui`;

function agent(threadId: string, prompt: string, token = s.admin) {
  return new HttpAgent({
    url: url(),
    headers: { Authorization: `Bearer ${token}` },
    threadId,
    initialMessages: [{ id: 'm1', role: 'user', content: prompt }],
  });
}

/** One run of the agent with the real client: its events in order, and its last one. */
async function run(a: HttpAgent, runId: string, resume?: Parameters<HttpAgent['runAgent']>[0]) {
  const events: BaseEvent[] = [];
  await a.runAgent({ runId, ...resume }, { onEvent: ({ event }) => void events.push(event) });
  return { events, last: events.at(-1) as unknown as Body };
}

const text = (events: BaseEvent[]) =>
  (events.filter((e) => e.type === 'TEXT_MESSAGE_CONTENT') as unknown as { delta: string }[])
    .map((e) => e.delta)
    .join('');

/** A raw AG-UI request (for what the client would not send): its status and JSON body. */
async function post(body: unknown, token = s.admin): Promise<{ status: number; body: Body }> {
  const response = await fetch(url(), {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as Body };
}

const resumeBody = (threadId: string, resume: unknown) => ({
  threadId,
  runId: 'raw-run',
  messages: [{ id: 'm1', role: 'user', content: 'ask' }],
  resume,
});

describeWith({ PostgreSQL: postgres })("answering a paused run with AG-UI's resume input", () => {
  beforeAll(async () => {
    s = await startQuestionServer();
  });

  it('a question: the resumed run streams on under the new runId and finishes with the answer', async () => {
    const a = agent('agui-resume-q', 'ask via ag-ui');
    const paused = await run(a, 'first');
    expect(paused.last.outcome).toMatchObject({ type: 'interrupt', interrupts: [{ id: 'call_q' }] });
    const runId = paused.last.result.run_id as string;

    const resumed = await run(a, 'second', {
      resume: [{ interruptId: 'call_q', status: 'resolved', payload: 'Lisbon' }],
    });
    expect(resumed.events[0]).toMatchObject({
      type: 'RUN_STARTED',
      threadId: 'agui-resume-q',
      runId: 'second',
    });
    expect(resumed.events.map((e) => e.type)).not.toContain('RUN_ERROR');
    expect(resumed.last).toMatchObject({ type: 'RUN_FINISHED', runId: 'second', result: { run_id: runId } });
    expect(resumed.last.outcome).not.toMatchObject({ type: 'interrupt' });
    expect(text(resumed.events)).toBe('told: Lisbon');
    expect((await s.statusOf(runId)).output).toEqual({ text: 'One moment. told: Lisbon' });
    // The question reached the model as the tool's result.
    expect(s.asked.at(-1)!.messages.find((m) => m.role === 'tool')?.content).toBe('Lisbon');
  });

  it('an approval, then a question: approve through resume, the run pauses again, answered through resume', async () => {
    const a = agent('agui-resume-mixed', 'mixed via ag-ui');
    const paused = await run(a, 'first');
    expect(paused.last.outcome).toMatchObject({
      type: 'interrupt',
      interrupts: [{ id: 'call_b', reason: 'tool_approval' }],
    });
    const runId = paused.last.result.run_id as string;
    const approved = await run(a, 'second', {
      resume: [{ interruptId: 'call_b', status: 'resolved', payload: { approved: true } }],
    });
    // Approved, not run yet: the turn's calls go on together, once the question is answered too.
    expect(s.log).toEqual([]);
    expect(approved.last).toMatchObject({
      type: 'RUN_FINISHED',
      runId: 'second',
      outcome: { type: 'interrupt', interrupts: [{ id: 'call_q', reason: 'question' }] },
    });
    const done = await run(a, 'third', { resume: [{ interruptId: 'call_q', status: 'cancelled' }] });
    expect(done.last).toMatchObject({ type: 'RUN_FINISHED', runId: 'third', result: { run_id: runId } });
    expect((await s.statusOf(runId)).status).toBe('succeeded');
    expect(text(done.events)).toBe('told: booked 2 | The person dismissed the question without answering.');
    expect(s.log).toEqual(['book 2']);
  });

  it('a declined approval: `cancelled` declines the call, which never runs', async () => {
    const before = s.log.length;
    const a = agent('agui-resume-decline', 'mixed decline');
    const paused = await run(a, 'first');
    const runId = paused.last.result.run_id as string;
    await run(a, 'second', {
      resume: [{ interruptId: 'call_b', status: 'cancelled', payload: { reason: 'too dear' } }],
    });
    expect((await s.statusOf(runId)).required_action).toMatchObject({ type: 'answer_question' });
    const done = await run(a, 'third', {
      resume: [{ interruptId: 'call_q', status: 'resolved', payload: 'Porto' }],
    });
    expect(done.last).toMatchObject({ type: 'RUN_FINISHED', runId: 'third' });
    expect(s.log).toHaveLength(before);
    expect(text(done.events)).toMatch(/^told: .*too dear.* \| Porto$/);
  });

  it('bad entries are 400s naming the field, and the run still waits', async () => {
    const a = agent('agui-resume-bad', 'ask bad');
    const runId = (await run(a, 'first')).last.result.run_id as string;
    const cases: [unknown, string][] = [
      [[{ interruptId: 'call_x', status: 'resolved', payload: 'x' }], 'resume[0].interruptId'],
      [[{ interruptId: 'call_q', status: 'maybe', payload: 'x' }], 'resume[0].status'],
      [[{ interruptId: 'call_q', status: 'resolved', payload: 42 }], 'resume[0].payload'],
      [[{ interruptId: 'call_q', status: 'resolved', payload: '   ' }], 'resume[0].payload'],
      [
        [
          { interruptId: 'call_q', status: 'resolved', payload: 'a' },
          { interruptId: 'call_q', status: 'resolved', payload: 'b' },
        ],
        'resume[1].interruptId',
      ],
      [['__proto__'], 'resume[0]'],
    ];
    for (const [resume, field] of cases) {
      const r = await post(resumeBody('agui-resume-bad', resume));
      expect([r.status, r.body.error?.param]).toEqual([400, field]);
    }
    expect((await s.statusOf(runId)).status).toBe('requires_action');
    // A thread that waits for nothing: 409; a thread never used: 404.
    const idle = await post(
      resumeBody('agui-resume-q', [{ interruptId: 'call_q', status: 'resolved', payload: 'x' }]),
    );
    expect([idle.status, idle.body.error?.code]).toEqual([409, 'run_not_requires_action']);
    const none = await post(
      resumeBody('never-used', [{ interruptId: 'call_q', status: 'resolved', payload: 'x' }]),
    );
    expect(none.status).toBe(404);
  });

  it("another tenant's thread is 404, by the client's thread id or by the Sluice one, and its run waits on", async () => {
    const a = agent('agui-resume-tenant', 'ask tenants');
    const runId = (await run(a, 'first')).last.result.run_id as string;
    const threadId = (await s.statusOf(runId)).thread_id as string;
    const other = await s.token({ tenant: 'other', role: 'member' });
    const entry = [{ interruptId: 'call_q', status: 'resolved', payload: 'Rome' }];
    for (const id of ['agui-resume-tenant', threadId]) {
      const r = await post(resumeBody(id, entry), other);
      expect([r.status, r.body.error?.code]).toEqual([404, 'not_found']);
    }
    expect((await s.statusOf(runId)).status).toBe('requires_action');
  });
});
