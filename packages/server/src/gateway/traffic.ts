/** One tenant's use of one gateway, since this process started: what the dashboard draws. */
export interface GatewayTrafficRow {
  readonly tenant: string;
  readonly gateway: string;
  readonly requests: number;
  /** Answers by status class: `2xx`, `4xx`, `5xx` (and `429` apart, the refusals that matter most). */
  readonly statuses: Readonly<Record<string, number>>;
  readonly inputTokens: number;
  readonly outputTokens: number;
  /** Open now: waiting for a slot or exchanging with the upstream. */
  readonly open: number;
}

type Row = { -readonly [K in keyof GatewayTrafficRow]: GatewayTrafficRow[K] } & {
  statuses: Record<string, number>;
};

/** Keys a tenant and gateway pair; a NUL cannot be in either name. */
const keyOf = (tenant: string, gateway: string) => `${tenant}\u0000${gateway}`;

/** Most pairs kept: tenant names come from tokens, and a table of them must not grow without end. */
const MAX_ROWS = 10_000;

/** Gateway traffic per tenant, counted in memory by this process. */
export class GatewayTraffic {
  readonly #rows = new Map<string, Row>();

  #row(tenant: string, gateway: string): Row {
    const key = keyOf(tenant, gateway);
    let row = this.#rows.get(key);
    if (!row) {
      if (this.#rows.size >= MAX_ROWS) {
        for (const [k, r] of this.#rows)
          if (r.open === 0) {
            this.#rows.delete(k);
            break;
          }
      }
      row = { tenant, gateway, requests: 0, statuses: {}, inputTokens: 0, outputTokens: 0, open: 0 };
      this.#rows.set(key, row);
    }
    return row;
  }

  opened(tenant: string, gateway: string): void {
    this.#row(tenant, gateway).open++;
  }

  /** One request answered (`opened` before it or not), with the usage its response reported. */
  answered(
    tenant: string,
    gateway: string,
    status: number,
    usage: { input?: number; output?: number } | undefined,
    wasOpen: boolean,
  ): void {
    const row = this.#row(tenant, gateway);
    if (wasOpen) row.open = Math.max(0, row.open - 1);
    row.requests++;
    const bucket = status === 429 ? '429' : `${Math.floor(status / 100)}xx`;
    row.statuses[bucket] = (row.statuses[bucket] ?? 0) + 1;
    row.inputTokens += usage?.input ?? 0;
    row.outputTokens += usage?.output ?? 0;
  }

  /** The rows of one tenant, or of all; by tenant, then gateway. */
  read(tenant?: string): GatewayTrafficRow[] {
    const rows = [...this.#rows.values()]
      .filter((r) => tenant === undefined || r.tenant === tenant)
      .map((r) => ({ ...r, statuses: { ...r.statuses } }));
    return rows.sort((a, b) => keyOf(a.tenant, a.gateway).localeCompare(keyOf(b.tenant, b.gateway)));
  }
}
