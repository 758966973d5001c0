import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { PausedState } from 'sluice';
import type { ProviderStandIn } from '@sluice/testkit';
import { checkApprovals } from '../../src/runs/approvals.js';
import { pauseRun, resumeRun } from '../../src/runs/lifecycle.js';
import { getRun } from '../../src/runs/store.js';
import { until, type Body } from '../helpers.js';
import { openStream } from '../held/sse.js';
import {
  answerAll,
  bankProvider,
  startApprovalServer,
  type ApprovalServer,
  type ToolLog,
} from './harness.js';

// One server for the file: every test makes runs of its own.
let s: ApprovalServer;
let provider: ProviderStandIn;
const log: ToolLog = [];

beforeAll(async () => {
  provider = await bankProvider();
  s = await startApprovalServer({ provider, log, tenants: { capped: { maxConcurrentAgentRuns: 1 } } });
});
afterAll(async () => {
  await s?.close();
  await provider?.close();
});

const resume = (id: string, body: unknown, token?: string) =>
  s.call('POST', `/agents/runs/${id}/resume`, body, token);

async function pause(input: string, extra: Record<string, unknown> = {}, token?: string): Promise<Body> {
  const r = await s.call('POST', '/agents/bank/runs', { input, ...extra }, token);
  expect(r.status).toBe(200);
  expect(r.body.status).toBe('requires_action');
  return r.body;
}

describe('approvals over HTTP', () => {
  it('approve: the run pauses with the pending call, holds no slot, and finishes with the tool result once approved', async () => {
    log.length = 0;
    const paused = await pause('pay 500');
    expect(paused.required_action).toEqual({
      type: 'approve_tool_calls',
      tool_calls: [{ id: 'call_t', name: 'transfer', arguments: { amount: 500 } }],
    });
    // The call that needed no approval ran; the guarded one did not.
    expect(log).toEqual(['lookup']);
    expect((await s.call('GET', `/agents/runs/${paused.id}`)).body).toMatchObject({
      status: 'requires_action',
      required_action: paused.required_action,
      finished_at: null,
    });
    // The agent's limiter has one slot: a run of the same agent goes through while this one waits.
    const other = await s.call('POST', '/agents/bank/runs', { input: 'hello' });
    expect(other.body).toMatchObject({ status: 'succeeded', output: { text: 'done hello' } });

    const done = await resume(paused.id, { approvals: [{ tool_call_id: 'call_t', approved: true }] });
    expect(done.status).toBe(200);
    expect(done.body).toMatchObject({
      id: paused.id,
      status: 'succeeded',
      output: { text: 'Checking. told: sent 500 | balance 900' },
      usage: { requests: 2 },
    });
    expect(done.body.required_action).toBeUndefined();
    expect(log).toEqual(['lookup', 'transfer 500']);
    // Nothing waits any more.
    const again = await resume(paused.id, { approvals: [{ tool_call_id: 'call_t', approved: true }] });
    expect(again.status).toBe(409);
    expect(again.body.error).toMatchObject({ code: 'run_not_requires_action', status: 'succeeded' });
  });

  it('decline: the tool does not run and the model is told so, with the reason', async () => {
    log.length = 0;
    const paused = await pause('pay 70');
    const done = await resume(paused.id, { approvals: answerAll(paused, false, 'not this month') });
    expect(done.body).toMatchObject({ status: 'succeeded' });
    expect(done.body.output.text).toBe(
      'Checking. told: The user declined this call to transfer; it did not run. Reason: not this month | balance 900',
    );
    expect(log).toEqual(['lookup']);
  });

  it('answers that do not match the pending calls get 400 naming the field; another tenant gets 404; of two resumes at once one wins', async () => {
    log.length = 0;
    const paused = await pause('pay 9');
    const cases: [unknown, string][] = [
      [{}, 'approvals'],
      [{ approvals: [] }, 'approvals'],
      [{ approvals: [{ tool_call_id: 'call_l', approved: true }] }, 'approvals[0].tool_call_id'],
      [
        {
          approvals: [
            { tool_call_id: 'call_t', approved: true },
            { tool_call_id: 'call_t', approved: false },
          ],
        },
        'approvals[1].tool_call_id',
      ],
      [{ approvals: [{ tool_call_id: 'call_t', approved: 'yes' }] }, 'approvals[0].approved'],
      [{ approvals: [{ tool_call_id: 'call_t', approved: false, reason: 7 }] }, 'approvals[0].reason'],
      [
        { approvals: [{ tool_call_id: 'call_t', approved: false, reason: 'x'.repeat(4_001) }] },
        'approvals[0].reason',
      ],
    ];
    for (const [body, param] of cases) {
      const r = await resume(paused.id, body);
      expect([r.status, r.body.error.param]).toEqual([400, param]);
    }
    const stranger = await s.token({ tenant: 'other', role: 'member' });
    const foreign = await resume(paused.id, { approvals: answerAll(paused, true) }, stranger);
    expect(foreign.status).toBe(404);
    expect((await s.call('GET', `/agents/runs/${paused.id}`)).body.status).toBe('requires_action');

    const both = await Promise.all([
      resume(paused.id, { approvals: answerAll(paused, true), wait: false }),
      resume(paused.id, { approvals: answerAll(paused, false), wait: false }),
    ]);
    expect(both.map((r) => r.status).sort()).toEqual([202, 409]);
    expect(both.find((r) => r.status === 409)!.body.error.code).toBe('run_not_requires_action');
    await until(async () => (await s.call('GET', `/agents/runs/${paused.id}`)).body.status === 'succeeded');
    // The winner's answer alone was carried out (the first request approves, the second declines).
    const approvedWon = both[0]!.status === 202;
    expect(log.filter((l) => l.startsWith('transfer'))).toEqual(approvedWon ? ['transfer 9'] : []);
  });

  it('a paused run does not count for the tenant cap, and resume is accepted with the cap full', async () => {
    const member = await s.token({ tenant: 'capped', role: 'member' });
    const paused = await pause('pay 11', {}, member);
    // Cap 1: the paused run leaves room for this one, which stalls at the provider.
    const filler = await s.call('POST', '/agents/echo/runs', { input: 'stall', wait: false }, member);
    expect(filler.status).toBe(202);
    const refused = await s.call('POST', '/agents/echo/runs', { input: 'hi', wait: false }, member);
    expect(refused.status).toBe(429);
    expect(refused.body.error.code).toBe('agent_run_concurrency_limit');
    const done = await resume(paused.id, { approvals: answerAll(paused, true) }, member);
    expect(done.status).toBe(200);
    expect(done.body).toMatchObject({
      status: 'succeeded',
      output: { text: 'Checking. told: sent 11 | balance 900' },
    });
    expect(
      (await s.call('POST', `/agents/runs/${filler.body.id}/cancel`, undefined, member)).body.status,
    ).toBe('canceled');
  });

  it('a paused run can be canceled; it cannot be resumed after', async () => {
    const paused = await pause('pay 5');
    const canceled = await s.call('POST', `/agents/runs/${paused.id}/cancel`);
    expect(canceled.status).toBe(200);
    expect(canceled.body.status).toBe('canceled');
    const late = await resume(paused.id, { approvals: answerAll(paused, true) });
    expect([late.status, late.body.error.code]).toEqual([409, 'run_not_requires_action']);
  });

  it('a run whose cancel was asked for elsewhere while it ran ends canceled when it would pause, freeing its thread', async () => {
    // Another process asked for the cancel (the row says so) and this one pauses before its
    // next look: the pause must not swallow the cancel, or a person could approve the call later.
    const thread = (await s.call('POST', '/threads', {})).body.id as string;
    const paused = await pause('pay 7', { thread_id: thread });
    const db = s.server.store.db;
    await db.query(
      `UPDATE agent_runs SET status = 'running', worker = 'w-other', cancel_requested_at = clock_timestamp()
       WHERE id = $1::text`,
      [paused.id],
    );
    const state = (
      await db.query<{ paused_state: PausedState }>(
        'SELECT paused_state FROM agent_runs WHERE id = $1::text',
        [paused.id],
      )
    ).rows[0]!.paused_state;
    const written = await pauseRun(db, paused.id as string, 'w-other', {
      status: 'requires_action',
      pending: state.pending,
      state,
    });
    expect(written?.status).toBe('canceled');
    const after = (await s.call('GET', `/agents/runs/${paused.id}`)).body;
    expect([after.status, after.required_action ?? null]).toEqual(['canceled', null]);
    expect((await s.call('GET', `/threads/${thread}`)).body.status).toBe('idle');
  });

  it('a resume checked against calls the run has since replaced moves nothing', async () => {
    // Read while paused on transfer(9); meanwhile resumed by someone else and paused again on
    // transfer(9000) under the same call id. The stale answers must not approve the new call.
    const paused = await pause('pay 9');
    const db = s.server.store.db;
    const seen = (await getRun(db, 't', paused.id as string))!;
    const replaced = {
      type: 'approve_tool_calls',
      tool_calls: [{ id: 'call_t', name: 'transfer', arguments: { amount: 9000 } }],
    };
    await db.query('UPDATE agent_runs SET required_action = $2::jsonb WHERE id = $1::text', [
      paused.id,
      JSON.stringify(replaced),
    ]);
    const approvals = checkApprovals(seen, answerAll(paused, true));
    expect(await resumeRun(db, 't', paused.id as string, approvals, seen.required_action)).toBeUndefined();
    expect((await s.call('GET', `/agents/runs/${paused.id}`)).body.status).toBe('requires_action');
    await s.call('POST', `/agents/runs/${paused.id}/cancel`);
  });

  it('a thread with a paused run refuses new runs at once with thread_requires_action, keeps the run, and on_busy cancel clears it', async () => {
    const thread = (await s.call('POST', '/threads', {})).body.id as string;
    const paused = await pause('pay 100', { thread_id: thread });
    expect((await s.call('GET', `/threads/${thread}`)).body.status).toBe('requires_action');
    // Held and queued runs alike: no waiting behind a person.
    for (const extra of [{}, { wait: false }]) {
      const r = await s.call('POST', '/agents/echo/runs', { input: 'hi', thread_id: thread, ...extra });
      expect(r.status).toBe(409);
      expect(r.body.error).toMatchObject({
        code: 'thread_requires_action',
        thread_id: thread,
        active_run_id: paused.id,
      });
    }
    // Resumed, the run finishes on its thread and appends its messages.
    const done = await resume(paused.id, { approvals: answerAll(paused, true) });
    expect(done.body.status).toBe('succeeded');
    const messages = (await s.call('GET', `/threads/${thread}/messages`)).body.data as Body[];
    expect(messages.map((m) => [m.role, m.content])).toEqual([
      ['user', 'pay 100'],
      ['assistant', 'Checking. told: sent 100 | balance 900'],
    ]);
    expect((await s.call('GET', `/threads/${thread}`)).body.status).toBe('idle');

    // Paused again; on_busy cancel cancels the paused run and the new run proceeds.
    const second = await pause('pay 200', { thread_id: thread });
    const next = await s.call('POST', '/agents/echo/runs', {
      input: 'hi',
      thread_id: thread,
      on_busy: 'cancel',
    });
    expect(next.status).toBe(200);
    expect(next.body.status).toBe('succeeded');
    expect((await s.call('GET', `/agents/runs/${second.id}`)).body.status).toBe('canceled');
  });

  it('a stream of a run that pauses ends with run.requires_action carrying the pending calls', async () => {
    const stream = await openStream(`${s.server.url}/api/client/v1/agents/bank/runs`, await s.token(), {
      input: 'pay 3',
      stream: true,
    });
    expect(stream.status).toBe(200);
    const events = await stream.rest();
    const names = events.map((e) => e.event).filter((n) => n !== 'message.delta');
    expect(names).toEqual([
      'run.created',
      'run.started',
      'tool.started',
      'tool.completed',
      'run.requires_action',
    ]);
    expect(events.filter((e) => e.event.startsWith('tool.')).map((e) => e.data.name)).toEqual([
      'lookup',
      'lookup',
    ]);
    const last = events.at(-1)!.data as Body;
    expect(last).toMatchObject({
      status: 'requires_action',
      required_action: { type: 'approve_tool_calls', tool_calls: [{ id: 'call_t', name: 'transfer' }] },
    });
    await s.call('POST', `/agents/runs/${last.id}/cancel`);
  });
});
