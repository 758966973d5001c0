/**
 * One workload's waiting requests, served fairly by key (the rule is in allocate.ts: start
 * tags, smallest first, ties by arrival). The shape keeps every step cheap whatever the depth:
 *
 * - a lane per key: its requests first in, first out, in an intrusive list (O(1) push, and
 *   O(1) removal of a cancelled request from the middle);
 * - a binary heap of the lanes that have requests, ordered by their heads: O(log keys) per
 *   arrival of a new key, per grant and per removal of a head;
 * - iteration in serving order without changing anything (allocate reads it lazily and may
 *   stop at any point): a small heap of candidates, seeded with the lane heap's root, so
 *   reading the first `g` requests costs O(g log g), not O(depth).
 *
 * With one lane (nobody uses keys) the iteration is the lane's own list, as before keys.
 *
 * Lanes are forgotten when they hold nothing and their key's history no longer matters:
 * `startTag` of a key whose latest grant is older than the virtual time is the virtual time,
 * exactly as for a key never seen; and when a grant empties the queue, every lane but the one
 * just served goes (see `#forgetAllBut`), so memory stays proportional to the keys in play.
 */
import { servingOrder, startTag } from './allocate.js';
import { WaitQueue, type QueueNode } from './wait-queue.js';

/** A waiting request as the fair queue sees it. `tag` is set when it is pushed. */
export interface FairNode<N extends FairNode<N>> extends QueueNode<N> {
  readonly seq: number;
  tag: number;
  lane: Lane<N> | undefined;
}

export interface Lane<N extends FairNode<N>> {
  readonly key: string;
  readonly queue: WaitQueue<N>;
  lastGrantTag: number | undefined;
  /** Position in the lane heap; -1 when the lane holds nothing. */
  heapIndex: number;
  /** In the list of empty lanes that the next advance of virtual time may forget. */
  idle: boolean;
}

export class FairQueue<N extends FairNode<N>> implements Iterable<N> {
  #virtualTime = 0;
  #size = 0;
  readonly #lanes = new Map<string, Lane<N>>();
  readonly #heap: Lane<N>[] = [];
  #idle: Lane<N>[] = [];

  get size(): number {
    return this.#size;
  }

  /** The start tag of the workload's latest grant. */
  get virtualTime(): number {
    return this.#virtualTime;
  }

  /** Keys remembered (queued, or granted at the current virtual time); for leak tests. */
  get lanes(): number {
    return this.#lanes.size;
  }

  /** Queues `node` under `key` and gives it its start tag. */
  push(node: N, key: string): void {
    const lane = this.#lane(key);
    node.tag = startTag({
      virtualTime: this.#virtualTime,
      newestQueuedTag: lane.queue.tail?.tag,
      lastGrantTag: lane.lastGrantTag,
    });
    node.lane = lane;
    lane.queue.push(node);
    this.#size++;
    if (lane.queue.size === 1) this.#heapPush(lane);
  }

  /** Takes `node` out without a grant (cancelled, timed out). A node not queued is left alone. */
  remove(node: N): void {
    const lane = node.lane;
    if (lane === undefined || !node.queued) return;
    const wasHead = lane.queue.head === node;
    lane.queue.remove(node);
    this.#size--;
    if (lane.queue.size === 0) {
      this.#heapRemove(lane);
      this.#retire(lane);
    } else if (wasHead) {
      // The new head has a larger tag: the lane can only move down.
      this.#siftDown(lane.heapIndex);
    }
  }

  /** Takes `node` out as granted: the virtual time moves to its tag. */
  grant(node: N): void {
    const lane = node.lane;
    if (lane === undefined || !node.queued) return;
    this.#advance(node.tag);
    lane.lastGrantTag = node.tag;
    this.remove(node);
    if (this.#size === 0) this.#forgetAllBut(lane);
  }

  /**
   * Records a grant made without queueing (the workload had room, so it has nobody waiting),
   * and returns the tag it would have had: the same history as if it had queued and been
   * granted at once, which is what the PostgreSQL limiter does.
   */
  grantNow(key: string): number {
    const known = this.#lanes.get(key);
    const tag = startTag({ virtualTime: this.#virtualTime, lastGrantTag: known?.lastGrantTag });
    // After the advance: it may have forgotten this very lane.
    this.#advance(tag);
    const lane = this.#lane(key);
    lane.lastGrantTag = tag;
    if (lane.queue.size === 0) this.#retire(lane);
    if (this.#size === 0) this.#forgetAllBut(lane);
    return tag;
  }

  /**
   * A grant that leaves the queue empty ends a busy period: no other key's history can put it
   * behind anyone any more but the key just served (one tag later than a newcomer), so only
   * that one is kept. Without this, keys of one request each are all granted at the same
   * virtual time, which then never moves on, and every one of them would be kept for ever.
   */
  #forgetAllBut(lane: Lane<N>): void {
    if (this.#lanes.size === 1 && this.#idle.length <= 1) return;
    for (const other of this.#idle) if (other !== lane) other.idle = false;
    this.#idle = lane.idle ? [lane] : [];
    this.#lanes.clear();
    if (lane.lastGrantTag !== undefined) this.#lanes.set(lane.key, lane);
  }

  [Symbol.iterator](): Iterator<N> {
    if (this.#heap.length === 0) return EMPTY;
    if (this.#heap.length === 1) return this.#heap[0]!.queue[Symbol.iterator]();
    return new ServingIterator(this.#heap);
  }

  #lane(key: string): Lane<N> {
    let lane = this.#lanes.get(key);
    if (lane === undefined) {
      lane = { key, queue: new WaitQueue<N>(), lastGrantTag: undefined, heapIndex: -1, idle: false };
      this.#lanes.set(key, lane);
    }
    return lane;
  }

  #advance(tag: number): void {
    if (tag <= this.#virtualTime) return;
    this.#virtualTime = tag;
    // Every idle lane's latest grant is now older than the virtual time: forget it.
    for (const lane of this.#idle) {
      lane.idle = false;
      if (lane.queue.size === 0 && this.#lanes.get(lane.key) === lane) this.#lanes.delete(lane.key);
    }
    this.#idle = [];
  }

  /** An empty lane: kept only while its latest grant still decides its next tag. */
  #retire(lane: Lane<N>): void {
    if (lane.lastGrantTag !== undefined && lane.lastGrantTag >= this.#virtualTime) {
      if (!lane.idle) {
        lane.idle = true;
        this.#idle.push(lane);
      }
    } else if (!lane.idle) {
      this.#lanes.delete(lane.key);
    }
  }

  #less(a: Lane<N>, b: Lane<N>): boolean {
    return servingOrder(a.queue.head!, b.queue.head!) < 0;
  }

  #heapPush(lane: Lane<N>): void {
    lane.heapIndex = this.#heap.length;
    this.#heap.push(lane);
    this.#siftUp(lane.heapIndex);
  }

  #heapRemove(lane: Lane<N>): void {
    const i = lane.heapIndex;
    const last = this.#heap.pop()!;
    lane.heapIndex = -1;
    if (last === lane) return;
    this.#heap[i] = last;
    last.heapIndex = i;
    this.#siftDown(i);
    this.#siftUp(last.heapIndex);
  }

  #siftUp(i: number): void {
    const heap = this.#heap;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (!this.#less(heap[i]!, heap[parent]!)) return;
      this.#swap(i, parent);
      i = parent;
    }
  }

  #siftDown(i: number): void {
    const heap = this.#heap;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let min = i;
      if (l < heap.length && this.#less(heap[l]!, heap[min]!)) min = l;
      if (r < heap.length && this.#less(heap[r]!, heap[min]!)) min = r;
      if (min === i) return;
      this.#swap(i, min);
      i = min;
    }
  }

  #swap(i: number, j: number): void {
    const heap = this.#heap;
    const a = heap[i]!;
    const b = heap[j]!;
    heap[i] = b;
    heap[j] = a;
    a.heapIndex = j;
    b.heapIndex = i;
  }
}

const EMPTY: Iterator<never> = { next: () => ({ done: true, value: undefined }) };

/**
 * A candidate of the serving iterator: a node, and where it came from: the head of the lane at
 * `heapIndex` in the lane heap, or (heapIndex -1) the successor of a node already yielded.
 */
interface Candidate<N> {
  readonly node: N;
  readonly heapIndex: number;
}

/**
 * Yields every queued node in serving order, without touching the queue. A node is yielded
 * only after everything that must come before it: its lane predecessor, and the head of its
 * lane's parent in the lane heap; so the candidates are the heads of those two relations.
 */
class ServingIterator<N extends FairNode<N>> implements Iterator<N> {
  readonly #candidates: Candidate<N>[] = [];

  constructor(private readonly lanes: readonly Lane<N>[]) {
    this.#offer({ node: lanes[0]!.queue.head!, heapIndex: 0 });
  }

  next(): IteratorResult<N> {
    const top = this.#take();
    if (top === undefined) return { done: true, value: undefined };
    const { node, heapIndex } = top;
    if (node.next !== undefined) this.#offer({ node: node.next, heapIndex: -1 });
    if (heapIndex >= 0) {
      for (const child of [2 * heapIndex + 1, 2 * heapIndex + 2]) {
        const lane = this.lanes[child];
        if (lane !== undefined) this.#offer({ node: lane.queue.head!, heapIndex: child });
      }
    }
    return { done: false, value: node };
  }

  #offer(candidate: Candidate<N>): void {
    const heap = this.#candidates;
    heap.push(candidate);
    let i = heap.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (servingOrder(heap[i]!.node, heap[parent]!.node) >= 0) break;
      [heap[i], heap[parent]] = [heap[parent]!, heap[i]!];
      i = parent;
    }
  }

  #take(): Candidate<N> | undefined {
    const heap = this.#candidates;
    const top = heap[0];
    const last = heap.pop();
    if (top === undefined || last === undefined || heap.length === 0) return top;
    heap[0] = last;
    let i = 0;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let min = i;
      if (l < heap.length && servingOrder(heap[l]!.node, heap[min]!.node) < 0) min = l;
      if (r < heap.length && servingOrder(heap[r]!.node, heap[min]!.node) < 0) min = r;
      if (min === i) break;
      [heap[i], heap[min]] = [heap[min]!, heap[i]!];
      i = min;
    }
    return top;
  }
}
