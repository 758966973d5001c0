import { Counter, Histogram, type Registry } from 'prom-client';

/** From a few ms (a refusal upstream, a cached answer) to the minutes of a long stream. */
const UPSTREAM_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300];

/**
 * The gateway's Prometheus series, on the server's registry: requests by gateway and the
 * status the caller got (the upstream's, or the gateway's own refusal), and how long the
 * upstream exchanges took, from sending the request to the end of its response.
 */
export class GatewayMetrics {
  readonly #requests: Counter<'gateway' | 'status'>;
  readonly #upstream: Histogram<'gateway'>;

  constructor(registry: Registry, gateways: Iterable<string>) {
    const registers = [registry];
    this.#requests = new Counter({
      name: 'sluice_gateway_requests_total',
      help: 'Requests to each provider gateway of this process, by the status answered',
      labelNames: ['gateway', 'status'],
      registers,
    });
    this.#upstream = new Histogram({
      name: 'sluice_gateway_upstream_seconds',
      help: 'How long upstream exchanges of each gateway took, from the request sent to the end of the response',
      labelNames: ['gateway'],
      buckets: UPSTREAM_BUCKETS_S,
      registers,
    });
    for (const gateway of gateways) this.#requests.inc({ gateway, status: '200' }, 0);
  }

  answered(gateway: string, status: number): void {
    this.#requests.inc({ gateway, status: String(status) });
  }

  upstream(gateway: string, seconds: number): void {
    this.#upstream.observe({ gateway }, seconds);
  }
}
