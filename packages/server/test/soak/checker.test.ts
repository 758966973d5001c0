import { describe, expect, it } from 'vitest';
import { check, type Caps, type History, type RunRow } from '../../../../bench/soak/checker.js';
import type { Call } from '../../../../bench/soak/load.js';

// The soak's checker must catch what it claims to: each invariant broken on purpose in a
// small history, and a clean history passing.

const caps: Caps = {
  activePerTenant: 2,
  tenantQuota: { t3: 1 },
  activePerProject: 2,
  deferredRunningPerTenant: 1,
  providerLimit: 4,
};
const at = (s: number) => new Date(Date.UTC(2026, 0, 1, 0, 0, s));
const t0 = at(0).getTime();

function run(id: string, over: Partial<RunRow> = {}): RunRow {
  return {
    id,
    tenant: 't1',
    project: 'p1',
    class: 'default',
    status: 'succeeded',
    thread_id: null,
    callback_url: null,
    created_at: at(0),
    started_at: at(1),
    finished_at: at(2),
    scheduled_for: null,
    ...over,
  };
}

function call(runId: string | undefined, over: Partial<Call> = {}): Call {
  return {
    kind: 'queued',
    tenant: 't1/p1',
    token: `tok-${runId}`,
    server: 's1',
    sentAt: t0,
    endedAt: t0 + 100,
    status: 202,
    runId,
    callback: false,
    ...over,
  };
}

const history = (over: Partial<History> = {}): History => ({
  calls: [],
  executions: [],
  deliveries: [],
  faults: [],
  samples: { processes: [], sessions: [] },
  providerPeak: 1,
  ...over,
});

const clean = () => {
  const runs = [run('r1'), run('r2', { created_at: at(3), started_at: at(3), finished_at: at(4) })];
  return { runs, history: history({ calls: [call('r1'), call('r2')] }) };
};

const failing = (verdict: ReturnType<typeof check>) =>
  Object.entries(verdict.violations).filter(([, n]) => n > 0);

describe("the soak's checker", () => {
  it('passes a clean history', () => {
    const { runs, history: h } = clean();
    expect(failing(check(h, runs, caps))).toEqual([]);
  });

  it('counts an accepted run that is missing or not final as lost', () => {
    const verdict = check(
      history({ calls: [call('r1'), call('gone')] }),
      [run('r1', { status: 'running' })],
      caps,
    );
    expect(failing(verdict)).toEqual([['lost_runs', 2]]);
  });

  it('counts a final state that differs from the one the client was told', () => {
    const verdict = check(
      history({ calls: [call('r1', { final: 'succeeded' })] }),
      [run('r1', { status: 'failed' })],
      caps,
    );
    expect(failing(verdict)).toEqual([['two_final_states', 1]]);
  });

  it('counts a run executed twice', () => {
    const e = (pid: number) => ({ runId: 'r1', token: 't', pid, at: t0 });
    const verdict = check(history({ calls: [call('r1')], executions: [e(1), e(2)] }), [run('r1')], caps);
    expect(failing(verdict)).toEqual([['ran_twice', 1]]);
  });

  it("counts each cap exceeded at an instant: tenant, a tenant's quota, project, deferred running, thread", () => {
    const overlapping = (id: string, over: Partial<RunRow>) =>
      run(id, { created_at: at(0), started_at: at(1), finished_at: at(10), ...over });
    const runs = [
      // three default-class runs of t1/p1 at once: tenant cap 2 and project cap 2
      overlapping('a1', {}),
      overlapping('a2', {}),
      overlapping('a3', {}),
      // two of t3, whose quota is 1
      overlapping('b1', { tenant: 't3' }),
      overlapping('b2', { tenant: 't3' }),
      // two deferred runs of t4 running at once
      overlapping('c1', { tenant: 't4', class: 'deferred' }),
      overlapping('c2', { tenant: 't4', class: 'deferred' }),
      // two runs of one thread at once (of tenants with room)
      overlapping('d1', { tenant: 't5', thread_id: 'th' }),
      overlapping('d2', { tenant: 't6', thread_id: 'th' }),
    ];
    const verdict = check(history(), runs, caps);
    expect(verdict.violations.cap_exceeded).toBe(5);
    expect(verdict.examples.cap_exceeded).toEqual([
      expect.stringMatching(/^tenant t1: 3/),
      expect.stringMatching(/^tenant t3: 2 .* cap 1$/),
      expect.stringMatching(/^project t1\/p1: 3/),
      expect.stringMatching(/^deferred running of tenant t4: 2/),
      expect.stringMatching(/^thread th: 2/),
    ]);
  });

  it('lets a run start the instant another ends, and counts a scheduled run only from its start', () => {
    const runs = [
      run('a1', { created_at: at(0), started_at: at(0), finished_at: at(5) }),
      run('a2', { created_at: at(0), started_at: at(0), finished_at: at(5) }),
      run('a3', { created_at: at(5), started_at: at(5), finished_at: at(9) }),
      // created long before, due later: not active before its start
      run('s1', { created_at: at(0), scheduled_for: at(6), started_at: at(6), finished_at: at(7) }),
    ];
    expect(check(history(), runs, caps).violations.cap_exceeded).toBe(0);
  });

  it('counts the provider seeing more than the limit at once', () => {
    expect(check(history({ providerPeak: 5 }), [], caps).violations.provider_over_limit).toBe(1);
  });

  it('counts a final run with a callback_url that got none, and a repeat delivery outside any fault', () => {
    const runs = [
      run('r1', { callback_url: 'http://x/callback' }),
      run('r2', { callback_url: 'http://x/callback' }),
    ];
    const d = (atMs: number) => ({ deliveryId: 'msg_1', runId: 'r2', status: 'succeeded', at: atMs });
    const verdict = check(history({ deliveries: [d(t0), d(t0 + 1000)] }), runs, caps);
    expect(failing(verdict)).toEqual([
      ['callbacks_missing', 1],
      ['callbacks_duplicated', 1],
    ]);
    const fault = {
      kind: 'kill9' as const,
      startedAt: t0 + 200,
      readyAt: t0 + 500,
      endsAt: t0 + 600,
      detail: 's1',
    };
    expect(
      check(history({ deliveries: [d(t0), d(t0 + 1000)], faults: [fault] }), runs, caps).violations
        .callbacks_duplicated,
    ).toBe(0);
  });

  it('allows a 503 during a fault only: any other 5xx, or a 503 outside a fault, counts', () => {
    const fault = {
      kind: 'pg_restart' as const,
      startedAt: t0,
      readyAt: t0 + 1000,
      endsAt: t0 + 4000,
      detail: '',
    };
    const calls = [
      call(undefined, { status: 503, sentAt: t0 + 500, endedAt: t0 + 600 }),
      call(undefined, { status: 500, sentAt: t0 + 500, endedAt: t0 + 600 }),
      call(undefined, { status: 503, sentAt: t0 + 10_000, endedAt: t0 + 10_100 }),
    ];
    expect(check(history({ calls, faults: [fault] }), [], caps).violations.unexpected_5xx).toBe(2);
  });

  it('counts a fault after which the servers were not ready again', () => {
    const fault = { kind: 'kill9' as const, startedAt: t0, endsAt: t0 + 45_000, detail: 's2' };
    expect(check(history({ faults: [fault] }), [], caps).violations.not_ready_after_fault).toBe(1);
  });

  it('counts memory that keeps growing in one process, not a process that settles', () => {
    const sample = (pid: number, i: number, rssMb: number) => ({
      pid,
      server: 's1',
      at: t0 + i,
      rssMb,
      fds: 40,
    });
    const growing = [100, 120, 200, 300, 450, 600].map((mb, i) => sample(1, i, mb));
    const settled = [100, 300, 310, 305, 312, 309].map((mb, i) => sample(2, i, mb));
    const verdict = check(
      history({ samples: { processes: [...growing, ...settled], sessions: [] } }),
      [],
      caps,
    );
    expect(verdict.violations.unbounded_growth).toBe(1);
    expect(verdict.examples.unbounded_growth).toEqual([
      expect.stringMatching(/pid 1\): memory 200 -> 600 MB/),
    ]);
  });
});
