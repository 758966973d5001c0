/** A node of an intrusive doubly linked list: the waiting request carries its own links. */
export interface QueueNode<N> {
  prev: N | undefined;
  next: N | undefined;
  queued: boolean;
}

/**
 * Arrival-ordered queue with O(1) push, head removal and removal from the middle (a cancelled
 * or timed-out waiter), whatever the depth. Iterating yields oldest first.
 */
export class WaitQueue<N extends QueueNode<N>> implements Iterable<N> {
  #head: N | undefined;
  #tail: N | undefined;
  #size = 0;

  get size(): number {
    return this.#size;
  }

  /** The oldest node, if any. */
  get head(): N | undefined {
    return this.#head;
  }

  /** The newest node, if any. */
  get tail(): N | undefined {
    return this.#tail;
  }

  push(node: N): void {
    node.prev = this.#tail;
    node.next = undefined;
    node.queued = true;
    if (this.#tail) this.#tail.next = node;
    else this.#head = node;
    this.#tail = node;
    this.#size++;
  }

  /** Removes `node`; a node no longer queued is left alone. */
  remove(node: N): void {
    if (!node.queued) return;
    if (node.prev) node.prev.next = node.next;
    else this.#head = node.next;
    if (node.next) node.next.prev = node.prev;
    else this.#tail = node.prev;
    node.prev = node.next = undefined;
    node.queued = false;
    this.#size--;
  }

  [Symbol.iterator](): Iterator<N> {
    return new QueueIterator(this.#head);
  }
}

class QueueIterator<N extends QueueNode<N>> implements Iterator<N> {
  constructor(private current: N | undefined) {}

  next(): IteratorResult<N> {
    const node = this.current;
    if (node === undefined) return { done: true, value: undefined };
    this.current = node.next;
    return { done: false, value: node };
  }
}
