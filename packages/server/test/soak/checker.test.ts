import { describe, expect, it } from 'vitest';
import {
  check,
  type Caps,
  type History,
  type RunRow,
  type StatusChange,
} from '../../../../bench/soak/checker.js';
import type { FaultRecord } from '../../../../bench/soak/faults.js';
import type { Call } from '../../../../bench/soak/load.js';
import type { Execution } from '../../../../bench/soak/receiver.js';
import type { ProcessSample } from '../../../../bench/soak/samples.js';

// The soak's checker must catch what it claims to: each invariant broken on purpose in a
// small history, and a clean history passing.

const caps: Caps = {
  activePerTenant: 2,
  tenantQuota: { t3: 1 },
  activePerProject: 2,
  deferredRunningPerTenant: 1,
  deferredQueuedPerTenant: 2,
  scheduledPerTenant: 2,
  perUser: 1,
  providerLimit: 4,
};
const t0 = Date.UTC(2026, 0, 1);
const at = (s: number) => t0 + s * 1000;

function run(id: string, over: Partial<RunRow> = {}): RunRow {
  return {
    id,
    tenant: 't1',
    status: 'succeeded',
    callback_url: null,
    error_type: null,
    created: at(0),
    finished: at(2),
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

const fault = (over: Partial<FaultRecord> = {}): FaultRecord => ({
  kind: 'pg_restart',
  startedAt: at(10),
  readyAt: at(12),
  endsAt: at(15),
  detail: '',
  ...over,
});

/** A run's status changes: `steps` are [second, status] in order. */
function timeline(
  runId: string,
  steps: [number, string][],
  over: Partial<StatusChange> = {},
): StatusChange[] {
  return steps.map(([s, status]) => ({
    runId,
    tenant: 't1',
    project: 'p1',
    user: 'u1',
    class: 'default',
    mode: 'queued',
    threadId: null,
    status,
    at: at(s),
    startedAt: null,
    ...over,
  }));
}

const history = (over: Partial<History> = {}): History => ({
  calls: [],
  executions: [],
  deliveries: [],
  faults: [],
  changes: [],
  exits: [],
  samples: { processes: [], counts: {} },
  providerPeak: 1,
  ...over,
});

const mark = (runId: string, over: Partial<Execution> = {}): Execution => ({
  runId,
  token: `tok-${runId}`,
  pid: 1,
  startedAt: at(1),
  at: at(1),
  ...over,
});

const failing = (verdict: ReturnType<typeof check>) =>
  Object.entries(verdict.violations).filter(([, n]) => n > 0);

describe("the soak's checker", () => {
  it('passes a clean history', () => {
    const runs = [run('r1'), run('r2', { created: at(3), finished: at(4) })];
    const changes = [
      ...timeline('r1', [
        [0, 'queued'],
        [1, 'running'],
        [2, 'succeeded'],
      ]),
      ...timeline('r2', [
        [3, 'running'],
        [4, 'succeeded'],
      ]),
    ];
    const h = history({ calls: [call('r1'), call('r2')], executions: [mark('r1'), mark('r2')], changes });
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
      [run('r1', { status: 'failed', error_type: 'agent_error' })],
      caps,
    );
    expect(failing(verdict)).toEqual([['two_final_states', 1]]);
  });

  it('counts a run executed twice, by its id and by the client token of two runs', () => {
    const byId = check(history({ executions: [mark('r1'), mark('r1', { pid: 2 })] }), [run('r1')], caps);
    expect(failing(byId)).toEqual([['ran_twice', 1]]);
    // One call, executed as two runs: each run has one mark, the token has two.
    const byToken = check(
      history({ executions: [mark('r1', { token: 'tok' }), mark('r2', { token: 'tok' })] }),
      [run('r1'), run('r2')],
      caps,
    );
    expect(byToken.examples.ran_twice).toEqual([expect.stringMatching(/^token tok: executed by 2 runs/)]);
  });

  it('counts a mark made after the run ended, and a run the database saw start twice', () => {
    const late = check(history({ executions: [mark('r1', { startedAt: at(2) + 0.5 })] }), [run('r1')], caps);
    expect(late.examples.ran_twice).toEqual([expect.stringMatching(/^r1: executed at .* after it ended/)]);
    // A mark in the same millisecond, before the end's microsecond, is not late.
    const inTime = check(
      history({ executions: [mark('r1', { startedAt: at(2) })] }),
      [run('r1', { finished: at(2) + 0.4 })],
      caps,
    );
    expect(inTime.violations.ran_twice).toBe(0);
    const changes = [
      ...timeline('r1', [[0, 'queued']]),
      ...timeline('r1', [[1, 'running']], { startedAt: at(1) }),
      ...timeline('r1', [[3, 'running']], { startedAt: at(3) }),
      ...timeline('r1', [[4, 'succeeded']], { startedAt: at(3) }),
    ];
    const twice = check(history({ changes }), [run('r1', { finished: at(4) })], caps);
    expect(twice.examples.ran_twice).toEqual(['r1: started 2 times in the database']);
  });

  it("counts each cap exceeded at an instant: tenant, a tenant's quota, project, deferred queued and running, scheduled, thread, user", () => {
    const overlapping = (id: string, over: Partial<StatusChange> = {}, status = 'running') =>
      timeline(
        id,
        [
          [1, status],
          [10, 'succeeded'],
        ],
        over,
      );
    const changes = [
      // three default-class runs of t1/p1 at once: tenant cap 2 and project cap 2
      ...overlapping('a1'),
      ...overlapping('a2'),
      ...overlapping('a3', {}, 'queued'),
      // two of t3, whose quota is 1
      ...overlapping('b1', { tenant: 't3' }),
      ...overlapping('b2', { tenant: 't3' }),
      // three deferred runs of t4 waiting at once (cap 2), two running at once (cap 1)
      ...overlapping('c1', { tenant: 't4', class: 'deferred' }, 'queued'),
      ...overlapping('c2', { tenant: 't4', class: 'deferred' }, 'scheduled'),
      ...overlapping('c3', { tenant: 't4', class: 'deferred' }, 'queued'),
      ...overlapping('c4', { tenant: 't4', class: 'deferred' }),
      ...overlapping('c5', { tenant: 't4', class: 'deferred' }),
      // two runs of one thread at once (of tenants with room)
      ...overlapping('d1', { tenant: 't5', threadId: 'th', class: 'deferred' }),
      ...overlapping('d2', { tenant: 't6', threadId: 'th', class: 'deferred' }),
      // two held runs of one user at once (cap 1), deferred so no other cap counts them
      ...overlapping('e1', { tenant: 't7', user: 'u9', mode: 'inline', class: 'deferred' }),
      ...overlapping('e2', { tenant: 't8', user: 'u9', mode: 'inline', class: 'deferred' }),
      ...overlapping('e3', { tenant: 't8', user: 'u9', mode: 'inline', class: 'deferred' }),
      // three default-class runs of t9 waiting for their time at once (cap 2)
      ...overlapping('f1', { tenant: 't9' }, 'scheduled'),
      ...overlapping('f2', { tenant: 't9' }, 'scheduled'),
      ...overlapping('f3', { tenant: 't9' }, 'scheduled'),
    ];
    const verdict = check(history({ changes }), [], caps);
    expect(verdict.examples.cap_exceeded).toEqual([
      expect.stringMatching(/^tenant t1: 3/),
      expect.stringMatching(/^tenant t3: 2 .* cap 1$/),
      expect.stringMatching(/^project t1\/p1: 3/),
      expect.stringMatching(/^deferred queued of tenant t4: 3 .* cap 2$/),
      expect.stringMatching(/^deferred running of tenant t4: 2/),
    ]);
    // and t8's two held runs, deferred, are two running at once too
    expect(verdict.violations.cap_exceeded).toBe(9);
    const scheduled = check(history({ changes: changes.filter((c) => c.runId.startsWith('f')) }), [], caps);
    expect(scheduled.examples.cap_exceeded).toEqual([
      expect.stringMatching(/^scheduled of tenant t9: 3 .* cap 2$/),
    ]);
    const rest = check(history({ changes: changes.filter((c) => /^[de]/.test(c.runId)) }), [], caps);
    expect(rest.examples.cap_exceeded).toEqual([
      expect.stringMatching(/^deferred running of tenant t8/),
      expect.stringMatching(/^thread th: 2/),
      expect.stringMatching(/^user t8\/u9: 2 .* cap 1$/),
    ]);
  });

  it('lets a run start the microsecond after another ends, and counts a scheduled run only once promoted', () => {
    const changes = [
      ...timeline('a1', [
        [0, 'running'],
        [5, 'succeeded'],
      ]),
      ...timeline('a2', [
        [0, 'queued'],
        [0.5, 'running'],
        [5, 'succeeded'],
      ]),
      // starts 1 µs after a1 ends
      ...timeline('a3', [
        [5.000001, 'running'],
        [9, 'succeeded'],
      ]),
      // created long before, promoted when a2 ended
      ...timeline('s1', [
        [0, 'scheduled'],
        [5.000002, 'queued'],
        [6, 'running'],
        [7, 'succeeded'],
      ]),
    ];
    expect(check(history({ changes }), [], caps).violations.cap_exceeded).toBe(0);
    // The same with the promotion 1 µs early: three active at once.
    const early = changes.map((c) =>
      c.runId === 's1' && c.status === 'queued' ? { ...c, at: at(4.999999) } : c,
    );
    expect(check(history({ changes: early }), [], caps).examples.cap_exceeded).toEqual([
      expect.stringMatching(/^tenant t1: 3/),
      expect.stringMatching(/^project t1\/p1: 3/),
    ]);
  });

  it("counts a user's held run across a Redis restart (its server puts the place back); a run whose call came in the restart's gap is left out", () => {
    const held = (id: string, from: number, to: number) =>
      timeline(
        id,
        [
          [from, 'running'],
          [to, 'succeeded'],
        ],
        { mode: 'inline' },
      ).map((c) => ({ ...c, user: 'u', tenant: 't' }));
    const restart = fault({ kind: 'redis_restart', startedAt: at(11), readyAt: at(11.5), endsAt: at(14.5) });
    // x is held from before the restart to after it; y's call came just before the restart
    // (its take may have gone to the new, empty Redis), and z's well after.
    const changes = [...held('x', 0, 40), ...held('y', 11.2, 13), ...held('z', 25, 27)];
    const calls = [
      call('x', { kind: 'inline', sentAt: at(0) }),
      call('y', { kind: 'inline', sentAt: at(10.5) }),
      call('z', { kind: 'inline', sentAt: at(24.9) }),
    ];
    expect(check(history({ changes, calls, faults: [restart] }), [], caps).examples.cap_exceeded).toEqual([
      expect.stringMatching(/^user t\/u: 2 at .*:25\.000Z, cap 1$/),
    ]);
    // Without z: x and y together are within what the restart's gap allows.
    const withoutZ = { changes: changes.filter((c) => c.runId !== 'z'), calls: calls.slice(0, 2) };
    expect(check(history({ ...withoutZ, faults: [restart] }), [], caps).violations.cap_exceeded).toBe(0);
    // And without the restart, x and y are two at once.
    expect(check(history(withoutZ), [], caps).violations.cap_exceeded).toBe(1);
  });

  it('counts the provider seeing more than the limit at once', () => {
    expect(check(history({ providerPeak: 5 }), [], caps).violations.provider_over_limit).toBe(1);
  });

  it('counts a final run with a callback_url that got none, a call asking for one whose run has none, and a repeat outside any fault', () => {
    const runs = [
      run('r1', { callback_url: 'http://x/callback' }),
      run('r2', { callback_url: 'http://x/callback' }),
      run('r3'),
    ];
    const d = (atMs: number) => ({ deliveryId: 'msg_1', runId: 'r2', status: 'succeeded', at: atMs });
    const calls = [call('r3', { callback: true })];
    const verdict = check(history({ calls, deliveries: [d(t0), d(t0 + 1000)] }), runs, caps);
    expect(failing(verdict)).toEqual([
      ['callbacks_missing', 2],
      ['callbacks_duplicated', 1],
    ]);
    expect(verdict.examples.callbacks_missing).toEqual([
      expect.stringMatching(/^r1 /),
      expect.stringMatching(/^r3 .*callback_url not stored/),
    ]);
    const during = fault({ kind: 'kill9', startedAt: t0 + 200, readyAt: t0 + 500, endsAt: t0 + 600 });
    expect(
      check(history({ deliveries: [d(t0), d(t0 + 1000)], faults: [during] }), runs, caps).violations
        .callbacks_duplicated,
    ).toBe(0);
  });

  it("counts a callback whose status is not the run's final status", () => {
    const runs = [
      run('r1', { callback_url: 'http://x/callback', status: 'failed', error_type: 'agent_error' }),
    ];
    const deliveries = [{ deliveryId: 'msg_1', runId: 'r1', status: 'succeeded', at: t0 }];
    expect(failing(check(history({ deliveries }), runs, caps))).toEqual([['callbacks_wrong_status', 1]]);
  });

  it('allows a 503 only in the window of a fault that can cause one: any other 5xx, or a 503 outside, counts', () => {
    const pgRestart = fault();
    const provider500 = fault({ kind: 'provider_500', startedAt: at(30), readyAt: at(31), endsAt: at(34) });
    const calls = [
      call(undefined, { status: 503, sentAt: at(11), endedAt: at(11) }),
      call(undefined, { status: 500, sentAt: at(11), endedAt: at(11) }),
      // in the quiet gap between the two windows
      call(undefined, { status: 503, sentAt: at(20), endedAt: at(20) }),
      // a provider fault does not make a server answer 503
      call(undefined, { status: 503, sentAt: at(31), endedAt: at(31) }),
      // an error frame on a WebSocket stands for its status
      call(undefined, {
        kind: 'websocket',
        status: 101,
        error: 'store_unavailable',
        sentAt: at(11),
        endedAt: at(11),
      }),
      call(undefined, {
        kind: 'websocket',
        status: 101,
        error: 'internal_error',
        sentAt: at(11),
        endedAt: at(11),
      }),
      call(undefined, {
        kind: 'websocket',
        status: 101,
        error: 'store_unavailable',
        sentAt: at(20),
        endedAt: at(20),
      }),
    ];
    const verdict = check(history({ calls, faults: [pgRestart, provider500] }), [], caps);
    expect(failing(verdict)).toEqual([['unexpected_5xx', 5]]);
  });

  it("counts a network error outside the window of a fault that can cause one, or on another server than the fault's", () => {
    const kill = fault({ kind: 'kill9', target: 's2' });
    const calls = [
      call(undefined, {
        server: 's2',
        status: undefined,
        error: 'network:ECONNRESET',
        sentAt: at(11),
        endedAt: at(11),
      }),
      call(undefined, {
        server: 's1',
        status: undefined,
        error: 'network:ECONNRESET',
        sentAt: at(11),
        endedAt: at(11),
      }),
      call(undefined, {
        server: 's2',
        status: undefined,
        error: 'network:ECONNRESET',
        sentAt: at(20),
        endedAt: at(20),
      }),
      call('r1', {
        kind: 'streamed',
        server: 's2',
        status: 200,
        error: 'stream_ended_early',
        sentAt: at(20),
        endedAt: at(21),
      }),
      call(undefined, {
        kind: 'websocket',
        server: 's2',
        status: 101,
        error: 'closed_1006',
        sentAt: at(20),
        endedAt: at(21),
      }),
      // a database fault resets no client's connection
      call(undefined, {
        server: 's1',
        status: undefined,
        error: 'network:ECONNRESET',
        sentAt: at(41),
        endedAt: at(41),
      }),
    ];
    const dbCut = fault({ kind: 'db_cut', startedAt: at(40), readyAt: at(41), endsAt: at(44) });
    const verdict = check(history({ calls, faults: [kill, dbCut] }), [run('r1')], caps);
    expect(failing(verdict)).toEqual([['unexpected_errors', 5]]);
  });

  it('counts a timeout or worker_lost of a run whose life saw no fault', () => {
    const runs = [
      run('r1', { status: 'failed', error_type: 'worker_lost', created: at(0), finished: at(5) }),
      run('r2', { status: 'failed', error_type: 'timeout', created: at(0), finished: at(5) }),
      run('r3', { status: 'failed', error_type: 'worker_lost', created: at(9), finished: at(16) }),
      run('r4', { status: 'failed', error_type: 'agent_error', created: at(0), finished: at(5) }),
    ];
    expect(failing(check(history({ faults: [fault()] }), runs, caps))).toEqual([['unexpected_failures', 2]]);
  });

  it('counts a fault after which the servers were not ready again', () => {
    const never = fault({ kind: 'kill9', readyAt: undefined, detail: 's2' });
    expect(failing(check(history({ faults: [never] }), [], caps))).toEqual([['not_ready_after_fault', 1]]);
  });

  it('counts a server exit nobody asked for, and a drain that did not end', () => {
    const exits = [
      { server: 's1', pid: 10, at: at(3), what: 'exited by itself (code 1)' },
      { server: 's2', pid: 11, at: at(4), what: 'the SIGTERM drain had not ended after 33000 ms: killed' },
    ];
    expect(failing(check(history({ exits }), [], caps))).toEqual([['unexpected_exits', 2]]);
  });

  it('counts memory that keeps growing in one process, not a process that settles; and connections that keep growing', () => {
    const sample = (pid: number, i: number, rssMb: number): ProcessSample => ({
      pid,
      server: 's1',
      at: t0 + i,
      rssMb,
      fds: 40,
    });
    const growing = [100, 120, 150, 200, 250, 300, 380, 450, 520, 600, 650, 700].map((mb, i) =>
      sample(1, i, mb),
    );
    const settled = [100, 300, 310, 305, 312, 309, 311, 302, 308, 315, 306, 310].map((mb, i) =>
      sample(2, i, mb),
    );
    // One spike late in a settled process (a fault's moment) does not count either.
    settled[10] = sample(2, 10, 900);
    const sessions = [10, 20, 20, 22, 21, 23, 40, 60, 80, 100, 120, 140].map((count, i) => ({
      at: t0 + i,
      count,
    }));
    const verdict = check(
      history({
        samples: { processes: [...growing, ...settled], counts: { 'database sessions': sessions } },
      }),
      [],
      caps,
    );
    expect(verdict.examples.unbounded_growth).toEqual([
      expect.stringMatching(/pid 1\): memory 250 -> 650 MB/),
      'database sessions 22 -> 120',
    ]);
  });
});
