import { describe, expect, it } from 'vitest';
import { ManualClock } from 'sluice/concurrency';
import { BoundedMap } from '../../src/cache/bounded-map.js';
import { MemoryCacheStore } from '../../src/cache/memory.js';
import { placeKeys } from '../../src/cache/places.js';
import { failedAuthKey, failedAuthLimit } from '../../src/http/auth.js';

const MINUTE = 60_000;

function mapWithLog(maxKeys: number) {
  const clock = new ManualClock(1_000_000);
  const warnings: { message: string; fields: { evicted: number; refused: number } }[] = [];
  const map = new BoundedMap({
    maxKeys,
    now: () => clock.now(),
    warn: (message, fields) => warnings.push({ message, fields }),
  });
  return { clock, map, warnings };
}

describe('the memory cache store: at most maxKeys keys, kept keys never evicted', () => {
  it('evicts the least recently used open key: a read or a write counts as a use', () => {
    const { map } = mapWithLog(3);
    map.set('a', 1, { kept: false });
    map.set('b', 1, { kept: false });
    map.set('c', 1, { kept: false });
    expect(map.get('a')?.value).toBe(1); // a is now the most recently used: b is the oldest
    map.set('d', 1, { kept: false });
    expect(map.get('b')).toBeUndefined();
    map.set('c', 2, { kept: false }); // a write is a use too: a is now the oldest
    map.set('e', 1, { kept: false });
    expect(map.get('a')).toBeUndefined();
    expect(['c', 'd', 'e'].map((k) => map.get(k)?.value)).toEqual([2, 1, 1]);
    expect(map.size).toBe(3);
  });

  it('drops expired keys before evicting anything, even when the expired key was used more recently', () => {
    const { clock, map, warnings } = mapWithLog(3);
    map.set('old', 1, { kept: false });
    map.set('mid', 1, { kept: false });
    map.set('short', 1, { kept: false, ttlMs: 1000 });
    clock.advance(1000);
    map.set('new', 1, { kept: false });
    expect(map.get('old')?.value).toBe(1);
    expect(map.get('short')).toBeUndefined();
    // Making room from expired keys is not an eviction: nothing to warn about.
    expect(warnings).toEqual([]);
  });

  it('never evicts a kept key: at the cap with only kept keys, a new open key is refused, and a kept key too', () => {
    const { map, warnings } = mapWithLog(2);
    expect(map.set('place', 3, { kept: true })).toBe(true);
    expect(map.set('revoked', 1, { kept: true })).toBe(true);
    expect(map.set('counter', 1, { kept: false })).toBe(false);
    expect(map.set('another place', 1, { kept: true })).toBe(false);
    expect(map.get('place')?.value).toBe(3);
    expect(map.get('revoked')?.value).toBe(1);
    expect(map.size).toBe(2);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]!.fields).toMatchObject({ evicted: 0, refused: 1 });
  });

  it('warns at most once a minute, with what was evicted or refused since the last warning', () => {
    const { clock, map, warnings } = mapWithLog(2);
    for (let i = 0; i < 10; i++) map.set(`k${i}`, 1, { kept: false });
    expect(warnings).toHaveLength(1);
    expect(warnings[0]!.fields).toMatchObject({ evicted: 1, refused: 0 });
    expect(warnings[0]!.message).toContain('memory cache store is full (2 keys)');
    clock.advance(MINUTE - 1);
    map.set('k10', 1, { kept: false });
    expect(warnings).toHaveLength(1);
    clock.advance(1);
    map.set('k11', 1, { kept: false });
    expect(warnings).toHaveLength(2);
    // The 8 evictions after the first warning, and the one that triggered this one.
    expect(warnings[1]!.fields).toMatchObject({ evicted: 9, refused: 0 });
  });

  it('refuses a bound that is not a whole number of at least 1, naming the value', () => {
    expect(() => new BoundedMap({ maxKeys: 0 })).toThrow(/`maxKeys`.*at least 1, got `0`/);
  });

  it('a flood of 100,000 distinct failed-auth addresses evicts neither a place nor a revocation, and the store stays at 50,000 keys', async () => {
    const clock = new ManualClock(5_000_000);
    const warnings: string[] = [];
    const store = new MemoryCacheStore({ now: () => clock.now(), warn: (message) => warnings.push(message) });
    expect(store.map.maxKeys).toBe(50_000);
    const users = Array.from({ length: 100 }, (_, i) => placeKeys.heldRuns('t', `user${i}`));
    for (const key of users) expect((await store.take(key, 2)).ok).toBe(true);
    for (let i = 0; i < 100; i++) await store.revoke(`tok_${i}`);
    for (let i = 0; i < 100_000; i++) {
      const address = `10.${(i >> 16) & 255}.${(i >> 8) & 255}.${i & 255}`;
      await store.hit(failedAuthKey(address), failedAuthLimit.windowMs);
    }
    expect(store.map.size).toBe(50_000);
    for (const key of users) expect(await store.held(key)).toBe(1);
    // Still one place left each, and no more: the counts are intact, not re-created.
    for (const key of users) expect((await store.take(key, 2)).ok).toBe(true);
    for (const key of users) expect(await store.take(key, 2)).toEqual({ ok: false, held: 2 });
    for (let i = 0; i < 100; i++) expect(await store.isRevoked(`tok_${i}`)).toBe(true);
    expect(await store.isRevoked('tok_never')).toBe(false);
    // The latest addresses are counted; the earliest were evicted to make room.
    expect((await store.count(failedAuthKey('10.1.134.159'))).count).toBe(1);
    expect((await store.count(failedAuthKey('10.0.0.0'))).count).toBe(0);
    // One warning for the whole flood (the clock did not move).
    expect(warnings).toHaveLength(1);
  });

  it('places: a limit, an idempotent release, and a count that goes away at zero', async () => {
    const store = new MemoryCacheStore({ maxKeys: 10 });
    const key = placeKeys.wsUser('t', 'u');
    const first = await store.take(key, 2);
    const second = await store.take(key, 2);
    expect(await store.take(key, 2)).toEqual({ ok: false, held: 2 });
    if (!first.ok || !second.ok) throw new Error('expected both places');
    first.release();
    first.release();
    expect(await store.held(key)).toBe(1);
    second.release();
    expect(await store.held(key)).toBe(0);
    expect(store.map.size).toBe(0);
    // 0: no cap.
    for (let i = 0; i < 5; i++) expect((await store.take(key, 0)).ok).toBe(true);
    expect(await store.held(key)).toBe(5);
  });

  it('failed-auth counts: a window that starts with the first failure and ends a minute later', async () => {
    const clock = new ManualClock(0);
    const store = new MemoryCacheStore({ now: () => clock.now() });
    expect(await store.hit('a', MINUTE)).toEqual({ count: 1, leftMs: MINUTE });
    clock.advance(40_000);
    expect(await store.hit('a', MINUTE)).toEqual({ count: 2, leftMs: 20_000 });
    clock.advance(20_000);
    expect(await store.count('a')).toEqual({ count: 0, leftMs: 0 });
    expect(await store.hit('a', MINUTE)).toEqual({ count: 1, leftMs: MINUTE });
  });
});
