import { systemClock } from 'sluice/concurrency';

/**
 * A map of numbers with a hard bound on its keys, for the memory cache store. Keys a client can
 * create at will (failed-auth counters, one per address) are "open"; keys whose loss would lift
 * a bound or undo a revocation (places, caps, revocations) are "kept". At the bound, expired
 * keys go first, then the least recently used open key; a kept key is never evicted, so a
 * flood of open keys cannot push one out.
 */

export interface BoundedMapOptions {
  /** @default 50_000 */
  maxKeys?: number;
  /** Milliseconds; injected so tests can move time. @default the system clock's */
  now?: () => number;
  /** Told at most once per `warnEveryMs` when keys were evicted or could not be stored. */
  warn?: (message: string, fields: { evicted: number; refused: number; keys: number }) => void;
  /** @default 60_000 */
  warnEveryMs?: number;
}

interface Entry {
  value: number;
  /** Infinity: never. */
  expiresAt: number;
  kept: boolean;
}

export class BoundedMap {
  readonly maxKeys: number;
  readonly #now: () => number;
  readonly #warn: NonNullable<BoundedMapOptions['warn']>;
  readonly #warnEveryMs: number;
  /** Map order is recency: the first key is the least recently used. */
  readonly #open = new Map<string, Entry>();
  readonly #kept = new Map<string, Entry>();
  /** A min-heap of expiries; an item whose entry changed since is skipped when popped. */
  #expiries: { at: number; key: string; entry: Entry }[] = [];
  #lastWarn = -Infinity;
  #evicted = 0;
  #refused = 0;

  constructor(options: BoundedMapOptions = {}) {
    this.maxKeys = options.maxKeys ?? 50_000;
    if (!Number.isSafeInteger(this.maxKeys) || this.maxKeys < 1)
      throw new RangeError(
        `Expected \`maxKeys\` to be a whole number of at least 1, got \`${this.maxKeys}\``,
      );
    this.#now = options.now ?? systemClock.now;
    this.#warn = options.warn ?? (() => undefined);
    this.#warnEveryMs = options.warnEveryMs ?? 60_000;
  }

  get size(): number {
    return this.#open.size + this.#kept.size;
  }

  /** The live value of `key` (and the ms it has left), marking it as just used. */
  get(key: string): { value: number; leftMs: number } | undefined {
    const entry = this.#live(key);
    if (!entry) return undefined;
    if (!entry.kept) {
      this.#open.delete(key);
      this.#open.set(key, entry);
    }
    return { value: entry.value, leftMs: entry.expiresAt - this.#now() };
  }

  /**
   * Sets `key` (a new expiry only when `ttlMs` is given; none: never expires). False when the
   * map is full of kept keys and `key` is new: nothing was stored.
   */
  set(key: string, value: number, options: { kept: boolean; ttlMs?: number }): boolean {
    const now = this.#now();
    let entry = this.#live(key);
    if (entry && entry.kept !== options.kept) {
      this.delete(key);
      entry = undefined;
    }
    if (!entry) {
      if (!this.#makeRoom(now)) {
        this.#refused++;
        this.#maybeWarn(now);
        return false;
      }
      entry = { value, expiresAt: Infinity, kept: options.kept };
    }
    entry.value = value;
    if (options.ttlMs !== undefined) {
      entry.expiresAt = now + options.ttlMs;
      this.#pushExpiry(entry.expiresAt, key, entry);
    }
    const map = options.kept ? this.#kept : this.#open;
    map.delete(key);
    map.set(key, entry);
    return true;
  }

  delete(key: string): void {
    this.#open.delete(key);
    this.#kept.delete(key);
  }

  /** The entry of `key` unless it expired (an expired one is dropped on the way). */
  #live(key: string): Entry | undefined {
    const entry = this.#open.get(key) ?? this.#kept.get(key);
    if (entry && entry.expiresAt <= this.#now()) {
      this.delete(key);
      return undefined;
    }
    return entry;
  }

  /** Frees one key if the map is full: expired keys first, then the least recently used open key. */
  #makeRoom(now: number): boolean {
    if (this.size < this.maxKeys) return true;
    while (this.#expiries.length > 0 && this.#expiries[0]!.at <= now) {
      const { key, entry, at } = this.#popExpiry();
      const current = this.#open.get(key) ?? this.#kept.get(key);
      if (current === entry && entry.expiresAt === at) this.delete(key);
    }
    if (this.size < this.maxKeys) return true;
    const oldest = this.#open.keys().next();
    if (oldest.done) return false;
    this.#open.delete(oldest.value);
    this.#evicted++;
    this.#maybeWarn(now);
    return true;
  }

  #maybeWarn(now: number): void {
    if (now - this.#lastWarn < this.#warnEveryMs) return;
    this.#lastWarn = now;
    const fields = { evicted: this.#evicted, refused: this.#refused, keys: this.size };
    this.#evicted = 0;
    this.#refused = 0;
    this.#warn(
      `memory cache store is full (${this.maxKeys} keys): ${fields.evicted} least recently used keys evicted and ${fields.refused} not stored since the last warning`,
      fields,
    );
  }

  #pushExpiry(at: number, key: string, entry: Entry): void {
    // Stale items pile up when keys are rewritten; rebuilt from the live entries past a bound.
    if (this.#expiries.length > 2 * this.size + 1024) this.#rebuildExpiries();
    const heap = this.#expiries;
    heap.push({ at, key, entry });
    let i = heap.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (heap[parent]!.at <= heap[i]!.at) break;
      [heap[parent], heap[i]] = [heap[i]!, heap[parent]!];
      i = parent;
    }
  }

  #popExpiry(): { at: number; key: string; entry: Entry } {
    const heap = this.#expiries;
    const top = heap[0]!;
    const last = heap.pop()!;
    if (heap.length > 0) {
      heap[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let min = i;
        if (l < heap.length && heap[l]!.at < heap[min]!.at) min = l;
        if (r < heap.length && heap[r]!.at < heap[min]!.at) min = r;
        if (min === i) break;
        [heap[min], heap[i]] = [heap[i]!, heap[min]!];
        i = min;
      }
    }
    return top;
  }

  #rebuildExpiries(): void {
    const items: { at: number; key: string; entry: Entry }[] = [];
    for (const map of [this.#open, this.#kept])
      for (const [key, entry] of map)
        if (entry.expiresAt !== Infinity) items.push({ at: entry.expiresAt, key, entry });
    items.sort((a, b) => a.at - b.at);
    this.#expiries = items;
  }
}
