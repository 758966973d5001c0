import { beforeAll, expect, it } from 'vitest';
import { describeWith } from '../../../../scripts/service-suites.js';
import { postgres, until, type Body } from '../helpers.js';
import { checkAnswers } from '../../src/runs/answers.js';
import { decide } from '../../src/runs/approvals.js';
import { continues } from '../../src/runs/required-action.js';
import { getRun } from '../../src/runs/store.js';
import { startQuestionServer, type QuestionServer } from './harness.js';

// One server (on PostgreSQL) for the file: every test makes runs of its own.
let s: QuestionServer;

async function pause(input: string, extra: Record<string, unknown> = {}): Promise<Body> {
  const r = await s.call('POST', '/agents/concierge/runs', { input, ...extra });
  expect([r.status, r.body.status]).toEqual([200, 'requires_action']);
  return r.body;
}

const status = async (id: string) => (await s.call('GET', `/agents/runs/${id}`)).body.status as string;

describeWith({ PostgreSQL: postgres })('a question for a person over HTTP', () => {
  beforeAll(async () => {
    s = await startQuestionServer();
  });

  it('askHuman pauses the run with the question, holding no slot; the answer is the result the model reads', async () => {
    const paused = await pause('ask me');
    expect(paused.required_action).toEqual({
      type: 'answer_question',
      tool_call_id: 'call_q',
      question: 'Which city?',
      questions: [{ tool_call_id: 'call_q', name: 'ask_human', question: 'Which city?' }],
    });
    expect((await s.call('GET', `/agents/runs/${paused.id}`)).body).toMatchObject({
      status: 'requires_action',
      required_action: paused.required_action,
      finished_at: null,
    });
    // The agent's limiter has one slot: another run of it goes through while this one waits.
    const other = await s.call('POST', '/agents/concierge/runs', { input: 'hello' });
    expect(other.body).toMatchObject({ status: 'succeeded', output: { text: 'done hello' } });

    const sent = s.asked.length;
    const done = await s.resume(paused.id, { answers: [{ tool_call_id: 'call_q', text: 'Lisbon' }] });
    expect(done.status).toBe(200);
    expect(done.body).toMatchObject({
      id: paused.id,
      status: 'succeeded',
      output: { text: 'One moment. told: Lisbon' },
      usage: { requests: 2 },
    });
    expect(done.body.required_action).toBeUndefined();
    // The model's next request carried the answer as the call's result.
    expect(s.asked.length).toBe(sent + 1);
    expect(s.asked.at(-1)!.messages.filter((m) => m.role === 'tool')).toMatchObject([
      { tool_call_id: 'call_q', content: 'Lisbon' },
    ]);
    const again = await s.resume(paused.id, { answers: [{ tool_call_id: 'call_q', text: 'Porto' }] });
    expect([again.status, again.body.error.code]).toEqual([409, 'run_not_requires_action']);
  });

  it('an ask tool without a question argument asks its arguments as JSON', async () => {
    const paused = await pause('pick one');
    expect(paused.required_action).toMatchObject({
      type: 'answer_question',
      tool_call_id: 'call_p',
      question: '{"options":["train","plane"]}',
    });
    const done = await s.resume(paused.id, { answers: [{ tool_call_id: 'call_p', text: 'train' }] });
    expect(done.body).toMatchObject({ status: 'succeeded', output: { text: 'One moment. told: train' } });
  });

  it('answers that do not fit get 400 naming the field, and move nothing; another tenant gets 404', async () => {
    const paused = await pause('ask hostile');
    const sent = s.asked.length;
    const cases: [unknown, string][] = [
      [{}, 'answers'],
      [{ answers: [] }, 'answers'],
      [{ answers: 'Lisbon' }, 'answers'],
      [{ answers: [null] }, 'answers[0].tool_call_id'],
      [{ answers: [{ tool_call_id: 'call_x', text: 'a' }] }, 'answers[0].tool_call_id'],
      [{ answers: [{ tool_call_id: '__proto__', text: 'a' }] }, 'answers[0].tool_call_id'],
      [{ answers: [{ tool_call_id: 7, text: 'a' }] }, 'answers[0].tool_call_id'],
      [
        {
          answers: [
            { tool_call_id: 'call_q', text: 'a' },
            { tool_call_id: 'call_q', text: 'b' },
          ],
        },
        'answers[1].tool_call_id',
      ],
      [{ answers: [{ tool_call_id: 'call_q' }] }, 'answers[0].text'],
      [{ answers: [{ tool_call_id: 'call_q', text: '' }] }, 'answers[0].text'],
      [{ answers: [{ tool_call_id: 'call_q', text: '  \n ' }] }, 'answers[0].text'],
      [{ answers: [{ tool_call_id: 'call_q', text: 42 }] }, 'answers[0].text'],
      [{ answers: [{ tool_call_id: 'call_q', text: 'x'.repeat(32_001) }] }, 'answers[0].text'],
      [{ answers: [{ tool_call_id: 'call_q', text: 'nul \u0000 here' }] }, 'answers[0].text'],
      [{ answers: [{ tool_call_id: 'call_q', text: 'lone \ud800 half' }] }, 'answers[0].text'],
      // Approvals to a run that waits for answers; both at once.
      [{ approvals: [{ tool_call_id: 'call_q', approved: true }] }, 'approvals'],
      [
        {
          answers: [{ tool_call_id: 'call_q', text: 'a' }],
          approvals: [{ tool_call_id: 'call_q', approved: true }],
        },
        'approvals',
      ],
    ];
    for (const [body, param] of cases) {
      const r = await s.resume(paused.id, body);
      expect([r.status, r.body.error.code, r.body.error.param]).toEqual([400, 'invalid_request', param]);
    }
    const big = await s.resume(paused.id, {
      answers: [{ tool_call_id: 'call_q', text: 'x'.repeat(32_001) }],
    });
    expect(big.body.error).toMatchObject({ limit_value: 32_000 });
    expect(big.body.error.message).toContain('at most 32000 characters');
    // A `__proto__` key in the body is refused by the JSON parser itself.
    const proto = await s.call('POST', `/agents/runs/${paused.id}/resume`, undefined, undefined, {
      raw: '{"answers":[{"tool_call_id":"call_q","text":"a","__proto__":{"text":"b"}}]}',
    });
    expect([proto.status, proto.body.error.param]).toEqual([400, '__proto__']);
    const stranger = await s.token({ tenant: 'other', role: 'member' });
    const foreign = await s.resume(paused.id, { answers: [{ tool_call_id: 'call_q', text: 'a' }] }, stranger);
    expect(foreign.status).toBe(404);
    // Nothing moved: still waiting on the same question, and the model was not asked again.
    expect((await s.call('GET', `/agents/runs/${paused.id}`)).body).toMatchObject({
      status: 'requires_action',
      required_action: paused.required_action,
    });
    expect(s.asked.length).toBe(sent);
    const done = await s.resume(paused.id, { answers: [{ tool_call_id: 'call_q', text: 'Rome' }] });
    expect(done.body).toMatchObject({ status: 'succeeded', output: { text: 'One moment. told: Rome' } });
  });

  it('two questions in one turn: a partial answer keeps the run waiting on the other; the run goes on once both are answered', async () => {
    const paused = await pause('two things');
    expect(paused.required_action).toEqual({
      type: 'answer_question',
      tool_call_id: 'call_q',
      question: 'Which city?',
      questions: [
        { tool_call_id: 'call_q', name: 'ask_human', question: 'Which city?' },
        { tool_call_id: 'call_m', name: 'ask_human', question: 'Which month?' },
      ],
    });
    const sent = s.asked.length;
    // The second question first: kept, and the run now shows the one left.
    const partial = await s.resume(paused.id, { answers: [{ tool_call_id: 'call_m', text: 'May' }] });
    expect(partial.status).toBe(200);
    expect(partial.body).toMatchObject({
      status: 'requires_action',
      required_action: {
        type: 'answer_question',
        tool_call_id: 'call_q',
        question: 'Which city?',
        questions: [{ tool_call_id: 'call_q', name: 'ask_human', question: 'Which city?' }],
      },
    });
    expect(s.asked.length).toBe(sent);
    expect(await status(paused.id)).toBe('requires_action');
    // Answered once: a second answer to it is an answer to a call not waiting.
    const twice = await s.resume(paused.id, { answers: [{ tool_call_id: 'call_m', text: 'June' }] });
    expect([twice.status, twice.body.error.param]).toEqual([400, 'answers[0].tool_call_id']);
    const done = await s.resume(paused.id, { answers: [{ tool_call_id: 'call_q', text: 'Oslo' }] });
    expect(done.body).toMatchObject({
      status: 'succeeded',
      output: { text: 'One moment. told: Oslo | May' },
    });
    expect(s.asked.length).toBe(sent + 1);
  });

  it('two partial answers at once: both are kept, whichever lands first, and the run goes on once', async () => {
    const paused = await pause('two at once');
    const sent = s.asked.length;
    const both = await Promise.all([
      s.resume(paused.id, { answers: [{ tool_call_id: 'call_q', text: 'Bern' }], wait: false }),
      s.resume(paused.id, { answers: [{ tool_call_id: 'call_m', text: 'July' }], wait: false }),
    ]);
    // One kept its answer with the run still waiting (200), the other resumed it (202).
    expect(both.map((r) => r.status).sort()).toEqual([200, 202]);
    await until(async () => (await status(paused.id)) === 'succeeded');
    const done = (await s.call('GET', `/agents/runs/${paused.id}`)).body;
    expect(done.output.text).toBe('One moment. told: Bern | July');
    expect(s.asked.length).toBe(sent + 1);
  });

  it('an approval and a question in one turn: the approval is asked first, then the question; the approved tool runs only once both are given', async () => {
    s.log.length = 0;
    const paused = await pause('mixed trip');
    expect(paused.required_action).toEqual({
      type: 'approve_tool_calls',
      tool_calls: [{ id: 'call_b', name: 'book', arguments: { nights: 2 } }],
    });
    const early = await s.resume(paused.id, { answers: [{ tool_call_id: 'call_q', text: 'Nice' }] });
    expect([early.status, early.body.error.param]).toEqual([400, 'answers']);
    const sent = s.asked.length;
    const approved = await s.resume(paused.id, { approvals: [{ tool_call_id: 'call_b', approved: true }] });
    expect(approved.status).toBe(200);
    expect(approved.body).toMatchObject({
      status: 'requires_action',
      required_action: { type: 'answer_question', tool_call_id: 'call_q', question: 'Which city?' },
    });
    // Approved but not run: the turn's calls go on together.
    expect(s.log).toEqual([]);
    expect(s.asked.length).toBe(sent);
    const late = await s.resume(paused.id, { approvals: [{ tool_call_id: 'call_b', approved: true }] });
    expect([late.status, late.body.error.param]).toEqual([400, 'approvals']);
    const done = await s.resume(paused.id, { answers: [{ tool_call_id: 'call_q', text: 'Nice' }] });
    expect(done.body).toMatchObject({
      status: 'succeeded',
      output: { text: 'One moment. told: booked 2 | Nice' },
    });
    expect(s.log).toEqual(['book 2']);
  });

  it('a paused run can be canceled, also half-decided; it cannot be resumed after', async () => {
    const paused = await pause('ask then cancel');
    const canceled = await s.call('POST', `/agents/runs/${paused.id}/cancel`);
    expect([canceled.status, canceled.body.status]).toEqual([200, 'canceled']);
    const late = await s.resume(paused.id, { answers: [{ tool_call_id: 'call_q', text: 'a' }] });
    expect([late.status, late.body.error.code]).toEqual([409, 'run_not_requires_action']);

    s.log.length = 0;
    const half = await pause('mixed then cancel');
    await s.resume(half.id, { approvals: [{ tool_call_id: 'call_b', approved: true }] });
    const stopped = await s.call('POST', `/agents/runs/${half.id}/cancel`);
    expect(stopped.body.status).toBe('canceled');
    expect((await s.resume(half.id, { answers: [{ tool_call_id: 'call_q', text: 'a' }] })).status).toBe(409);
    // The approved call never ran.
    expect(s.log).toEqual([]);
  });

  it('answers checked against questions the run has since replaced move nothing, and are not checked again against them', async () => {
    // Read while asking "Which city?"; meanwhile the run went on and asks something else under
    // the same call id. The stale answer must not become the new question's answer.
    const paused = await pause('ask stale');
    const db = s.server.store.db;
    const seen = (await getRun(db, 't', paused.id as string))!;
    const replaced = {
      type: 'answer_question',
      tool_call_id: 'call_q',
      question: 'Transfer all savings?',
      questions: [{ tool_call_id: 'call_q', name: 'ask_human', question: 'Transfer all savings?' }],
    };
    await db.query('UPDATE agent_runs SET required_action = $2::jsonb WHERE id = $1::text', [
      paused.id,
      JSON.stringify(replaced),
    ]);
    const answers = checkAnswers(seen, [{ tool_call_id: 'call_q', text: 'yes' }]);
    expect(await decide(db, seen, answers)).toBeUndefined();
    // The route's retry after a lost race is for a later stage of the same questions only.
    expect(continues(seen.required_action, replaced as never)).toBe(false);
    const q = (id: string, question: string) => ({ tool_call_id: id, name: 'ask_human', question });
    const stage = (...questions: ReturnType<typeof q>[]) =>
      ({ type: 'answer_question', ...questions[0], questions }) as never;
    const before = stage(q('a', 'Which city?'), q('b', 'Which month?'));
    expect(continues(before, stage(q('b', 'Which month?')))).toBe(true);
    expect(continues(before, stage(q('b', 'Which year?')))).toBe(false);
    expect(continues(before, before)).toBe(false);
    expect((await s.call('GET', `/agents/runs/${paused.id}`)).body).toMatchObject({
      status: 'requires_action',
      required_action: replaced,
    });
    await s.call('POST', `/agents/runs/${paused.id}/cancel`);
  });
});
