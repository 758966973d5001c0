import { beforeAll, expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { MAX_ANSWER_CHARS } from '../../src/runs/answers.js';
import { postgres, until, type Body } from '../helpers.js';
import { holdPauseEnds, startQuestionServer, type QuestionServer } from './harness.js';

// AG-UI's resume entries as a hostile or unlucky client sends them: two answers at once, ids
// that name object prototypes, answers past their limits, and a run cancelled before its answer.
// Over real HTTP on PostgreSQL.
let s: QuestionServer;

const url = () => `${s.server.url}/api/client/v1/agents/concierge/ag-ui`;

interface Answer {
  status: number;
  body: Body;
  text: string;
}

/** A raw AG-UI request: its status, its JSON body when it is one, and its text. */
async function post(body: unknown, token = s.admin): Promise<Answer> {
  const response = await fetch(url(), {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await response.text();
  let parsed: Body = {};
  try {
    parsed = JSON.parse(text) as Body;
  } catch {
    // An event stream.
  }
  return { status: response.status, body: parsed, text };
}

const turn = (threadId: string, runId: string, prompt: string) => ({
  threadId,
  runId,
  messages: [{ id: 'm1', role: 'user', content: prompt }],
});

const resuming = (threadId: string, resume: unknown) => ({ ...turn(threadId, 'again', 'ask'), resume });

/** A run of the thread paused on its question (`call_q`); its run id. */
async function pausedOn(threadId: string): Promise<string> {
  const first = await post(turn(threadId, 'first', 'ask me'));
  expect(first.status).toBe(200);
  expect(first.text).toContain('"interrupt"');
  const { rows } = await s.server.store.db.query<{ id: string }>(
    `SELECT r.id FROM agent_runs r JOIN threads t ON t.id = r.thread_id
     WHERE t.metadata ->> 'ag_ui_thread_id' = $1::text AND r.status = 'requires_action'`,
    [threadId],
  );
  expect(rows).toHaveLength(1);
  return rows[0]!.id;
}

describeWith({ PostgreSQL: postgres })('AG-UI resume entries against a hostile or unlucky client', () => {
  beforeAll(async () => {
    s = await startQuestionServer();
  });

  it('two resumes of one paused run at once: one streams the run on, the other is 409, and the answer is given once', async () => {
    const runId = await pausedOn('race');
    const entry = (text: string) => [{ interruptId: 'call_q', status: 'resolved', payload: text }];
    const answers = await Promise.all([
      post(resuming('race', entry('one'))),
      post(resuming('race', entry('two'))),
    ]);
    const statuses = answers.map((a) => a.status).sort();
    expect(statuses).toEqual([200, 409]);
    const loser = answers.find((a) => a.status === 409)!;
    expect(loser.body.error?.code).toBe('run_not_requires_action');
    const winner = answers.find((a) => a.status === 200)!;
    expect(winner.text).toContain('RUN_FINISHED');
    const run = await s.statusOf(runId);
    expect(run.status).toBe('succeeded');
    // The model was told one answer, the winner's.
    const told = s.asked.filter((r) => r.messages.some((m) => m.role === 'tool')).at(-1)!;
    const results = told.messages.filter((m) => m.role === 'tool').map((m) => m.content);
    expect(results).toHaveLength(1);
    expect(winner.text).toContain(`told: ${String(results[0])}`);
  });

  it("a resume that comes before the pause's last event is stored streams the resumed run, not the old pause", async () => {
    // The executor stores a pause's last event (`run.requires_action`) just after the run row
    // says it paused. A trigger holds that write back on a lock this test holds, so the resume
    // reads the stream while the write is still to come.
    const held = await holdPauseEnds(s.databaseUrl!);
    const runId = await pausedOn('unflushed');
    const answered = post(
      resuming('unflushed', [{ interruptId: 'call_q', status: 'resolved', payload: 'Lima' }]),
    );
    await until(async () => (await s.statusOf(runId)).status !== 'requires_action', 'the run resumed');
    await held.release();
    const winner = await answered;
    expect(winner.status).toBe(200);
    expect(winner.text).toContain('told: Lima');
    expect(winner.text).not.toContain('"interrupt"');
    expect((await s.statusOf(runId)).status).toBe('succeeded');
  });

  it('`__proto__` and `constructor` as interrupt ids are 400 naming the entry; as thread ids they are threads like any other', async () => {
    const runId = await pausedOn('proto-ids');
    for (const id of ['__proto__', 'constructor', 'toString', 'hasOwnProperty']) {
      const r = await post(resuming('proto-ids', [{ interruptId: id, status: 'resolved', payload: 'x' }]));
      expect([r.status, r.body.error?.param]).toEqual([400, 'resume[0].interruptId']);
    }
    // An entry whose own keys are prototype names, as JSON.parse makes them.
    const raw = await fetch(url(), {
      method: 'POST',
      headers: { authorization: `Bearer ${s.admin}`, 'content-type': 'application/json' },
      body: `{"threadId":"proto-ids","runId":"r","messages":[],"resume":[{"__proto__":{"interruptId":"call_q","status":"resolved","payload":"x"}}]}`,
    });
    expect(raw.status).toBe(400);
    expect((await s.statusOf(runId)).status).toBe('requires_action');
    for (const threadId of ['__proto__', 'constructor']) {
      const never = await post(
        resuming(threadId, [{ interruptId: 'call_q', status: 'resolved', payload: 'x' }]),
      );
      expect([never.status, never.body.error?.code]).toEqual([404, 'not_found']);
      // A first run under that id pauses on its question and is answered like any other.
      await pausedOn(threadId);
      const answered = await post(
        resuming(threadId, [{ interruptId: 'call_q', status: 'resolved', payload: 'Oslo' }]),
      );
      expect(answered.status).toBe(200);
      expect(answered.text).toContain('told: Oslo');
    }
  });

  it('answers past their limits are 4xx naming the field and the limit, and the run still waits', async () => {
    const runId = await pausedOn('huge');
    const long = await post(
      resuming('huge', [
        { interruptId: 'call_q', status: 'resolved', payload: 'x'.repeat(MAX_ANSWER_CHARS + 1) },
      ]),
    );
    expect(long.status).toBe(400);
    expect(long.body.error).toMatchObject({ param: 'resume[0].payload', limit_value: MAX_ANSWER_CHARS });
    expect(long.body.error?.message).toContain(String(MAX_ANSWER_CHARS));
    // The message shows the value cut short, not 32 KB of it.
    expect(JSON.stringify(long.body).length).toBeLessThan(4_000);
    const many = await post(
      resuming(
        'huge',
        Array.from({ length: 1_001 }, () => ({ interruptId: 'call_q', status: 'resolved', payload: 'x' })),
      ),
    );
    expect(many.status).toBe(400);
    expect(many.body.error?.param).toBe('resume');
    expect(many.body.error?.message).toContain('1000');
    const reason = await post(
      resuming('huge', [
        { interruptId: 'call_q', status: 'resolved', payload: 'y'.repeat(64 * 1024 * 1024) },
      ]),
    );
    expect(reason.status).toBe(413);
    expect(reason.body.error?.code).toBe('request_too_large');
    expect(reason.body.error?.limit_value).toEqual(expect.any(Number));
    expect((await s.statusOf(runId)).status).toBe('requires_action');
  });

  it('a run cancelled before its answer came: the resume is 409 and nothing runs', async () => {
    const runId = await pausedOn('cancelled');
    const asked = s.asked.length;
    const cancelled = await s.call('POST', `/agents/runs/${runId}/cancel`);
    expect(cancelled.status).toBe(200);
    const r = await post(
      resuming('cancelled', [{ interruptId: 'call_q', status: 'resolved', payload: 'late' }]),
    );
    expect(r.status).toBe(409);
    expect(r.body.error?.code).toBe('run_not_requires_action');
    expect((await s.statusOf(runId)).status).toBe('canceled');
    expect(s.asked.length).toBe(asked);
  });
});
