/**
 * Fair queuing by key in the in-memory limiter: the starvation bound of allocate.ts, shown
 * with ordered grant logs (one slot, each grant released before the next), and the fair
 * queue's memory kept to the keys in play.
 */
import { setImmediate as flush } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { createConcurrencyLimiter, type ConcurrencyLease, type ConcurrencyLimiter } from 'sluice/concurrency';
import { FairQueue, type FairNode, type Lane } from '../../src/concurrency/fair-queue.js';

type Limiter = ConcurrencyLimiter<string>;

/**
 * Queues `burst` (key and count, in this order, one key after the other unless `interleave`),
 * then one request of `probe`; releases one slot at a time and returns the keys granted before
 * the probe's request. The slot is held by `holderKey` meanwhile.
 */
async function grantsBeforeProbe(
  limiter: Limiter,
  options: {
    holderKey?: string;
    burst: [string | undefined, number][];
    interleave?: boolean;
    /** The probe's key; `null` for none (the FIFO control). */
    probe?: string | null;
  },
): Promise<(string | undefined)[]> {
  const controller = new AbortController();
  const granted: { key: string | undefined; probe: boolean; lease: ConcurrencyLease<string> }[] = [];
  const ask = (key: string | undefined, probe = false) =>
    limiter.acquire({ key, signal: controller.signal }).then(
      (lease) => void granted.push({ key, probe, lease }),
      () => undefined,
    );
  let current: ConcurrencyLease<string> = await limiter.acquire({ key: options.holderKey });
  const order: (string | undefined)[] = [];
  if (options.interleave) {
    const longest = Math.max(...options.burst.map(([, n]) => n));
    for (let i = 0; i < longest; i++) for (const [key, n] of options.burst) if (i < n) void ask(key);
  } else {
    for (const [key, n] of options.burst) for (let i = 0; i < n; i++) void ask(key);
  }
  const probe = options.probe === undefined ? 'B' : (options.probe ?? undefined);
  void ask(probe, true);
  for (;;) {
    await limiter.release(current);
    await flush();
    const next = granted.shift();
    if (next === undefined) throw new Error('the released slot went to nobody');
    current = next.lease;
    if (next.probe) break;
    order.push(next.key);
  }
  controller.abort(new Error('done'));
  await flush();
  await limiter.release(current);
  expect(await limiter.stats?.()).toMatchObject({ active: 0, queued: 0 });
  return order;
}

describe('starvation bound, in memory', () => {
  const make = () => createConcurrencyLimiter({ maxConcurrent: 1 });

  it("with 1,000 requests of key A queued, key B's request is granted within 2 grants (2 active keys)", async () => {
    // The holder is A: its burst starts one tag later, so B goes first.
    const fromA = await grantsBeforeProbe(make(), { holderKey: 'A', burst: [['A', 1000]] });
    expect(fromA).toEqual([]);
    // The holder is someone else: A's first request and B's share a tag, and A arrived first.
    const fromOther = await grantsBeforeProbe(make(), { holderKey: 'H', burst: [['A', 1000]] });
    expect(fromOther).toEqual(['A']);
  });

  it('without keys the same burst holds the request back by all 1,000 (the control)', async () => {
    const order = await grantsBeforeProbe(make(), { burst: [[undefined, 1000]], probe: null });
    // All requests share the implicit key, so the last one is served last: plain FIFO.
    expect(order).toHaveLength(1000);
  });

  it('three active keys: at most 2 grants of other keys come first, whatever the bursts', async () => {
    for (const holderKey of ['A', 'C', 'H']) {
      for (const interleave of [false, true]) {
        const order = await grantsBeforeProbe(make(), {
          holderKey,
          burst: [
            ['A', 600],
            ['C', 400],
          ],
          interleave,
        });
        expect(order.length, `holder ${holderKey}, interleave ${interleave}`).toBeLessThanOrEqual(2);
      }
    }
  });

  it('a key that was served moments ago gets back in line behind each other key, once', async () => {
    // B's probe comes right after B's own grant: it gets tag V + 1, so each other active key
    // may go once before it (at most 2 (n - 1) in general; here n = 3).
    const limiter: Limiter = make();
    const controller = new AbortController();
    const log: string[] = [];
    const leases: ConcurrencyLease<string>[] = [];
    const ask = (key: string) =>
      void limiter.acquire({ key, signal: controller.signal }).then(
        (lease) => (log.push(key), leases.push(lease)),
        () => undefined,
      );
    let current: ConcurrencyLease<string> = await limiter.acquire({ key: 'H' });
    for (let i = 0; i < 300; i++) ['A', 'C'].forEach(ask);
    ask('B');
    const serve = async () => {
      await limiter.release(current);
      await flush();
      current = leases.shift()!;
    };
    while (!log.includes('B')) await serve();
    ask('B');
    const before = log.length;
    while (log.lastIndexOf('B') < before) await serve();
    expect(log.length - before - 1).toBeLessThanOrEqual(2);
    controller.abort(new Error('done'));
    await flush();
    await limiter.release(current);
    expect(await limiter.stats?.()).toMatchObject({ active: 0, queued: 0 });
  });
});

interface Node extends FairNode<Node> {
  readonly seq: number;
}
const node = (seq: number): Node => ({
  seq,
  tag: 0,
  lane: undefined as Lane<Node> | undefined,
  prev: undefined,
  next: undefined,
  queued: false,
});

describe('the fair queue', () => {
  it('iterates in serving order without changing the queue, and forgets keys no longer in play', () => {
    const q = new FairQueue<Node>();
    const nodes = Array.from({ length: 3000 }, (_, i) => node(i));
    // 1,000 keys, three requests each, arriving round after round.
    for (const n of nodes) q.push(n, `k${n.seq % 1000}`);
    const order = [...q].map((n) => n.seq);
    expect(order).toEqual(nodes.map((n) => n.seq));
    expect([...q].length).toBe(3000);
    // Grant in serving order. The keys served at the current virtual time are remembered
    // (their next request starts one tag later); once the time moves on, they are forgotten.
    for (const n of [...q].slice(0, 2999)) q.grant(n);
    expect(q.virtualTime).toBe(2);
    expect(q.lanes).toBe(1000);
    // The last grant empties the queue: only the key served last still has a say.
    q.grant(nodes[2999]!);
    expect(q.size).toBe(0);
    expect(q.lanes).toBe(1);
    expect(q.grantNow('other')).toBe(2);
    expect(q.grantNow('other')).toBe(3);
    expect(q.lanes).toBe(1);
  });

  it('keys of one request each are not remembered for ever, granted at once or after waiting', () => {
    // Every such key is granted at the virtual time, which then never moves on: without the
    // forgetting on an empty queue, each one would stay (a leak of one lane per request).
    const q = new FairQueue<Node>();
    for (let i = 0; i < 10_000; i++) q.grantNow(`once-${i}`);
    expect(q.lanes).toBeLessThanOrEqual(1);
    for (let i = 0; i < 10_000; i++) {
      const n = node(i);
      q.push(n, `queued-${i}`);
      q.grant(n);
    }
    expect(q.lanes).toBeLessThanOrEqual(1);
    // The key served last still starts one tag later than a newcomer.
    q.grantNow('a');
    const [x, y] = [node(1), node(2)];
    q.push(x, 'a');
    q.push(y, 'b');
    expect([...q]).toEqual([y, x]);
  });

  it('serves the smallest tag first, ties by arrival, after removals from the middle', () => {
    const q = new FairQueue<Node>();
    const a = Array.from({ length: 5 }, (_, i) => node(i));
    for (const n of a) q.push(n, 'a');
    const b = [node(10), node(11)];
    for (const n of b) q.push(n, 'b');
    q.remove(a[0]!);
    q.remove(a[2]!);
    // Tags: a = 0..4 (0 and 2 gone), b = 0, 1.
    expect([...q].map((n) => n.seq)).toEqual([10, 1, 11, 3, 4]);
  });
});
