/**
 * Held runs of each user, in this process: the runs a caller is waiting on over an open
 * connection (inline and streamed). The per-user cap counts them. A count lives as long as
 * its request; nothing outlives the process, so a crash frees every place it held.
 */
export class HeldRuns {
  readonly #counts = new Map<string, number>();

  /** Takes a place for the user unless `limit` are held (0: no cap). Returns the release, or the count held. */
  take(
    tenant: string,
    user: string,
    limit: number,
  ): { ok: true; release: () => void } | { ok: false; held: number } {
    const key = `${tenant}\u0000${user}`;
    const held = this.#counts.get(key) ?? 0;
    if (limit > 0 && held >= limit) return { ok: false, held };
    this.#counts.set(key, held + 1);
    let released = false;
    return {
      ok: true,
      release: () => {
        if (released) return;
        released = true;
        const now = (this.#counts.get(key) ?? 1) - 1;
        if (now <= 0) this.#counts.delete(key);
        else this.#counts.set(key, now);
      },
    };
  }

  /** Held runs of one user now. */
  heldBy(tenant: string, user: string): number {
    return this.#counts.get(`${tenant}\u0000${user}`) ?? 0;
  }
}
