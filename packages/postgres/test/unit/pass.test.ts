import { describe, expect, it } from 'vitest';
import { resolveLimiterOptions } from 'sluice/concurrency';
import { decideEnqueues, decodePass, decodePassRow, planPass, type PassRow } from '../../src/pass.js';
import { storedForm } from '../../src/stored-limits.js';

const stored = storedForm(
  resolveLimiterOptions({
    maxConcurrent: 3,
    maxQueued: 4,
    workloads: { vip: { reserved: 1, priority: 10 }, bulk: { maxConcurrent: 2 } },
  }),
);

const empty: PassRow = {
  kind: '',
  workload: null,
  count: null,
  waiter_id: null,
  owner: null,
  seq: null,
  limits_json: null,
  next_expiry_ms: null,
  lease_id: null,
  fence: null,
  acquired_at: null,
  expires_at: null,
  tag: null,
  tokens_in: null,
  tokens_out: null,
  now_ms: null,
};
const row = (fields: Partial<PassRow>): PassRow => ({ ...empty, ...fields });
const limitsRow = row({ kind: 'limits', limits_json: JSON.stringify(stored) });
const capacityRow = row({ kind: 'capacity', fence: 0, now_ms: 1_700_000_000_000 });
const head = (workload: string, seq: number, owner = 'me', tag = 0) =>
  row({ kind: 'head', workload, seq, waiter_id: `w${seq}`, owner, tag, tokens_in: 0, tokens_out: 0 });

describe('decoding a pass', () => {
  it('decodes each kind of row into its own shape', () => {
    expect(decodePassRow(row({ kind: 'present', waiter_id: 'w1' }))).toEqual({
      kind: 'present',
      waiterId: 'w1',
    });
    expect(decodePassRow(limitsRow)).toEqual({ kind: 'limits', limits: stored });
    expect(decodePassRow(row({ kind: 'active', workload: 'vip', count: 2 }))).toEqual({
      kind: 'active',
      workload: 'vip',
      count: 2,
    });
    expect(decodePassRow(row({ kind: 'next-expiry', next_expiry_ms: 12.5 }))).toEqual({
      kind: 'next-expiry',
      inMs: 12.5,
    });
    expect(decodePassRow(head('bulk', 7, 'other'))).toEqual({
      kind: 'head',
      head: { seq: 7, tag: 0, id: 'w7', owner: 'other', workload: 'bulk', tokens: { input: 0, output: 0 } },
    });
    expect(
      decodePassRow(
        row({
          kind: 'claimed',
          lease_id: 'l1',
          workload: 'vip',
          owner: 'me',
          seq: 3,
          fence: 41,
          waiter_id: 'w3',
          acquired_at: 1000,
          expires_at: 31_000,
        }),
      ),
    ).toEqual({
      kind: 'claimed',
      lease: {
        id: 'l1',
        workload: 'vip',
        fence: 41,
        owner: 'me',
        offered: false,
        waiter_id: 'w3',
        acquired_at: 1000,
        expires_at: 31_000,
      },
    });
  });

  it('refuses a row of an unknown kind, or without a column its kind needs', () => {
    expect(() => decodePassRow(row({ kind: 'lease' }))).toThrow(
      'concurrency_pass_v4 returned a row of unknown kind `lease`',
    );
    expect(() => decodePassRow(row({ kind: 'head', workload: 'vip', seq: 1, owner: 'me' }))).toThrow(
      'concurrency_pass_v4 returned a `head` row without `waiter_id`',
    );
    expect(() => decodePassRow(row({ kind: 'active', workload: 'vip' }))).toThrow('without `count`');
  });

  it('folds the rows into the state the rules need, heads in arrival order', () => {
    const state = decodePass([
      row({ kind: 'present', waiter_id: 'w9' }),
      limitsRow,
      capacityRow,
      row({ kind: 'active', workload: 'bulk', count: 2 }),
      row({ kind: 'active', workload: 'gone', count: 5 }),
      row({ kind: 'queued', workload: 'vip', count: 1 }),
      row({ kind: 'queued', workload: 'bulk', count: 2 }),
      row({ kind: 'next-expiry', next_expiry_ms: 250 }),
      head('bulk', 9),
      head('bulk', 4),
      head('vip', 6),
    ])!;
    expect(state.limits).toEqual(stored);
    expect(state.active).toEqual([0, 2]);
    expect(state.queued).toBe(3);
    expect(state.heads.map((list) => list.map((h) => h.seq))).toEqual([[6], [4, 9]]);
    expect([...state.present]).toEqual(['w9']);
    expect(state.claimed).toEqual([]);
    expect(state.nextExpiryMs).toBe(250);
  });

  it('orders the heads of a workload by start tag, then arrival (fair queuing by key)', () => {
    const state = decodePass([
      limitsRow,
      capacityRow,
      head('bulk', 2, 'me', 5),
      head('bulk', 9, 'me', 4),
      head('bulk', 3, 'me', 4),
      head('vip', 8, 'me', 1),
    ])!;
    expect(state.heads.map((list) => list.map((h) => h.seq))).toEqual([[8], [3, 9, 2]]);
  });

  it('without a limits row, there is no such limiter', () => {
    expect(decodePass([])).toBeUndefined();
  });
});

describe('deciding the new entries of a pass', () => {
  it('in arrival order: granted, waiting, then queue-full once maxQueued others wait', () => {
    const { outcomes, dropped } = decideEnqueues({
      enqueues: [
        { id: 'a', timeoutMs: undefined },
        { id: 'b', timeoutMs: 500 },
        { id: 'c', timeoutMs: undefined },
        { id: 'd', timeoutMs: undefined },
      ],
      granted: new Set(['a', 'old1']),
      queued: 7, // old1, old2, old3 and the four new ones
      maxQueued: 3,
    });
    // Waiting after the grants: old2, old3 (2 others); b joins (3), then c and d find it full.
    expect([...outcomes]).toEqual([
      ['a', { kind: 'granted' }],
      ['b', { kind: 'waiting' }],
      ['c', { kind: 'queue-full', queued: 3, maxQueued: 3 }],
      ['d', { kind: 'queue-full', queued: 3, maxQueued: 3 }],
    ]);
    expect(dropped).toEqual(['c', 'd']);
  });

  it('a request that may not wait (0 left) is timed out unless granted; no maxQueued means no limit', () => {
    const { outcomes, dropped } = decideEnqueues({
      enqueues: [
        { id: 'a', timeoutMs: 0 },
        { id: 'b', timeoutMs: 0 },
        { id: 'c', timeoutMs: undefined },
      ],
      granted: new Set(['b']),
      queued: 1000,
      maxQueued: null,
    });
    expect([...outcomes]).toEqual([
      ['a', { kind: 'timed-out' }],
      ['b', { kind: 'granted' }],
      ['c', { kind: 'waiting' }],
    ]);
    expect(dropped).toEqual(['a']);
  });

  it('plans a pass with the shared rules: priority first, reservations kept, ceilings held', () => {
    const state = decodePass([
      limitsRow,
      capacityRow,
      row({ kind: 'active', workload: 'bulk', count: 1 }),
      row({ kind: 'queued', workload: 'vip', count: 1 }),
      row({ kind: 'queued', workload: 'bulk', count: 3 }),
      head('bulk', 1, 'other'),
      head('bulk', 2),
      head('bulk', 3),
      head('vip', 4),
    ])!;
    const plan = planPass(state, [
      { id: 'w3', workload: 'bulk', key: '', timeoutMs: undefined },
      { id: 'w4', workload: 'vip', key: '', timeoutMs: 0 },
    ]);
    // 3 slots, 1 in use by bulk: vip (priority) takes its reserved one, bulk its second and last.
    expect(plan.grants.map((g) => g.id)).toEqual(['w4', 'w1']);
    expect([...plan.outcomes]).toEqual([
      ['w3', { kind: 'waiting' }],
      ['w4', { kind: 'granted' }],
    ]);
    expect(plan.dropped).toEqual([]);
  });
});

describe('a pass with budgets, the pause and the adaptive limit', () => {
  const rated = storedForm(
    resolveLimiterOptions({ maxConcurrent: 4, rate: { tokensPerMinute: 6_000 }, adaptive: true }),
  );
  const now = 1_700_000_000_000;
  const passOf = (capacity: object | null, rows: PassRow[]) =>
    decodePass([
      row({ kind: 'limits', limits_json: JSON.stringify(rated) }),
      row({
        kind: 'capacity',
        limits_json: capacity === null ? null : JSON.stringify(capacity),
        fence: 50,
        now_ms: now,
      }),
      ...rows,
    ])!;
  const tokenHead = (seq: number, input: number) =>
    row({
      kind: 'head',
      workload: 'default',
      seq,
      waiter_id: `w${seq}`,
      owner: 'me',
      tag: 0,
      tokens_in: input,
      tokens_out: 0,
    });

  it('grants what fits the stored bucket, holds the rest back, stores the new level and says when to look again', () => {
    const state = passOf({ buckets: { tokens: { level: 1_000, at: now - 6_000 } } }, [
      row({ kind: 'queued', workload: 'default', count: 3 }),
      tokenHead(1, 1_200),
      tokenHead(2, 900),
      tokenHead(3, 10),
    ]);
    // 1,000 then, plus 6 s of refill (600): 1,600 now.
    const plan = planPass(state, []);
    expect(plan.grants.map((g) => g.id)).toEqual(['w1']);
    expect(JSON.parse(plan.capacity!).buckets.tokens).toEqual({ level: 400, at: now });
    // w2 needs 500 more: 5 s at 100 a second. w3 would fit, but arrived after w2.
    expect(plan.wakeAt).toBe(now + 5_000);
  });

  it('a release that reports a 429 pauses the same pass: the freed slot goes to nobody', () => {
    const state = passOf(null, [
      row({ kind: 'released', lease_id: 'l1', fence: 49, tokens_in: 100, tokens_out: 0 }),
      row({ kind: 'queued', workload: 'default', count: 1 }),
      tokenHead(1, 10),
    ]);
    const plan = planPass(
      state,
      [],
      [
        {
          leaseId: 'l1',
          fence: 49,
          details: { usage: { input: 40 }, provider: { status: 429, retryAfterMs: 2_000 } },
        },
      ],
    );
    expect(plan.grants).toEqual([]);
    expect(plan.releases.get('l1')).toEqual({
      throttled: { status: 429, retryAfterMs: 2_000 },
      limitChanged: { from: 4, to: 3, reason: 'overload' },
    });
    const stored = JSON.parse(plan.capacity!);
    expect(stored).toMatchObject({ pausedUntil: now + 2_000, limit: 3, ignoreUpTo: 50 });
    // The 60 tokens the usage left of the estimate came back (a full bucket stays full).
    expect(stored.buckets.tokens.level).toBe(6_000);
    expect(plan.wakeAt).toBe(now + 2_000);
  });

  it('without budgets or pause a pass writes nothing', () => {
    const state = decodePass([
      limitsRow,
      capacityRow,
      row({ kind: 'queued', workload: 'vip', count: 1 }),
      head('vip', 1),
    ])!;
    const plan = planPass(state, []);
    expect(plan.grants.map((g) => g.id)).toEqual(['w1']);
    expect(plan.capacity).toBeUndefined();
    expect(plan.wakeAt).toBeUndefined();
  });
});

describe('budgets learned from the provider, in the row', () => {
  const adaptive = storedForm(resolveLimiterOptions({ maxConcurrent: 4, adaptive: true }));
  const now = 1_700_000_000_000;
  const passOf = (limits: object, capacity: object | null, rows: PassRow[]) =>
    decodePass([
      row({ kind: 'limits', limits_json: JSON.stringify(limits) }),
      row({
        kind: 'capacity',
        limits_json: capacity === null ? null : JSON.stringify(capacity),
        fence: 50,
        now_ms: now,
      }),
      ...rows,
    ])!;
  const tokenHead = (seq: number, input: number) =>
    row({
      kind: 'head',
      workload: 'default',
      seq,
      waiter_id: `w${seq}`,
      owner: 'me',
      tag: 0,
      tokens_in: input,
      tokens_out: 0,
    });

  it('a release whose headers state a budget stores it, and the same pass grants by it', () => {
    const state = passOf(adaptive, null, [
      row({ kind: 'released', lease_id: 'l1', fence: 49, tokens_in: 100, tokens_out: 0 }),
      row({ kind: 'queued', workload: 'default', count: 2 }),
      tokenHead(1, 800),
      tokenHead(2, 500),
    ]);
    const plan = planPass(
      state,
      [],
      [
        {
          leaseId: 'l1',
          fence: 49,
          details: {
            usage: { input: 40 },
            provider: {
              status: 200,
              limits: { tokens: { limit: 6_000, remaining: 1_000, resetMs: 50_000 } },
            },
          },
        },
      ],
    );
    expect(plan.grants.map((g) => g.id)).toEqual(['w1']);
    const stored = JSON.parse(plan.capacity!);
    // The bucket starts at the answer's remaining (the release's own refund is below it).
    expect(stored.learned).toEqual({ tokens: { limit: 6_000 } });
    expect(stored.buckets.tokens).toEqual({ level: 200, at: now });
    // w2 is 300 short at 100 a second.
    expect(plan.wakeAt).toBe(now + 3_000);
    // The next pass, in any process, reads the figure back and holds w2 to it.
    const next = passOf(adaptive, stored, [
      row({ kind: 'queued', workload: 'default', count: 1 }),
      tokenHead(2, 500),
    ]);
    expect(next.capacity.learned).toEqual({ tokens: { limit: 6_000 } });
    expect(planPass(next, []).grants).toEqual([]);
  });

  it('rows without learned figures load; damaged entries are dropped field by field', () => {
    const old = passOf(adaptive, { buckets: {}, pausedUntil: 0, limit: 3, successes: 0, ignoreUpTo: 7 }, []);
    expect(old.capacity).toMatchObject({ limit: 3, ignoreUpTo: 7 });
    expect(old.capacity.learned).toBeUndefined();
    const damaged = passOf(
      adaptive,
      {
        buckets: { inputTokens: { level: 10, at: now }, tokens: { level: 5, at: now } },
        limit: 4,
        learned: {
          tokens: { limit: 'x' },
          requests: { limit: 0.5 },
          inputTokens: { limit: 600 },
          outputTokens: { limit: -1 },
        },
      },
      [],
    );
    expect(damaged.capacity.learned).toEqual({ inputTokens: { limit: 600 } });
    // Only the bucket of a budget in force is kept.
    expect(Object.keys(damaged.capacity.buckets)).toEqual(['inputTokens']);
    for (const learned of ['nonsense', null, [], 42]) {
      expect(passOf(adaptive, { learned }, []).capacity.learned).toBeUndefined();
    }
  });

  it('a limiter without adaptive ignores learned figures a row holds', () => {
    const plain = storedForm(resolveLimiterOptions({ maxConcurrent: 4 }));
    const state = passOf(plain, { learned: { tokens: { limit: 6_000 } } }, [
      row({ kind: 'queued', workload: 'default', count: 1 }),
      tokenHead(1, 9_000),
    ]);
    expect(state.capacity.learned).toBeUndefined();
    expect(planPass(state, []).grants.map((g) => g.id)).toEqual(['w1']);
  });
});
