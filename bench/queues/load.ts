/**
 * The load generator of bench:queues and bench:server, in its own process: autocannon POSTs
 * runs to one system, the tenants taking turns in `pattern`. `run` answers requests/s (of the
 * accepted answers), p50/p99 latency (ms), the wrong answers, and when the first request was
 * sent and the last answer came (wall clock, ms, for the end-to-end time).
 */
import autocannon from 'autocannon';
import { answerParent } from './child.js';
import type { SystemReady } from './options.js';

export interface LoadRequest {
  system: SystemReady;
  /** The tenant of each request, in turn. */
  pattern: string[];
  connections: number;
  /** Seconds of load, or a number of requests (`amount`). */
  seconds?: number;
  amount?: number;
}

export interface LoadResult {
  accepted: number;
  wrong: number;
  rps: number;
  p50: number;
  p99: number;
  startMs: number;
  endMs: number;
}

async function load(request: LoadRequest): Promise<LoadResult> {
  const { system, pattern } = request;
  const target = new URL(system.url);
  let k = 0;
  const result = await autocannon({
    url: target.origin,
    connections: request.connections,
    ...(request.amount ? { amount: request.amount } : { duration: request.seconds ?? 1 }),
    requests: [
      {
        method: 'POST',
        setupRequest: (req) => {
          const tenant = pattern[k++ % pattern.length]!;
          return {
            ...req,
            path: target.pathname,
            headers: system.headers[tenant],
            body: system.bodies[tenant],
          };
        },
      },
    ],
  });
  const accepted =
    (result.statusCodeStats as Record<string, { count: number }> | undefined)?.[system.status]?.count ?? 0;
  return {
    accepted,
    wrong: result.requests.total - accepted + result.errors + result.timeouts,
    rps: accepted / result.duration,
    p50: result.latency.p50,
    p99: result.latency.p99,
    startMs: new Date(result.start).getTime(),
    endMs: new Date(result.finish).getTime(),
  };
}

answerParent(
  {},
  {
    run: async (m) => ({ ...(await load(m as unknown as LoadRequest)) }),
    stop: () => undefined,
  },
);
