/**
 * The model provider of bench:queues, in its own process: the testkit's stand-in, answering
 * after `delayMs` (or never, for `stall`), and counting the requests in flight per tenant. The
 * tenant is the first word of the last user message, which every system sends the same way.
 * Requests: `mode { delayMs | stall }` (also resets the counts), `peaks` (the highest in-flight
 * count per tenant since the last `mode`, and requests answered), `stop`.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { startProviderStandIn, type StandInRequest } from '@sluice/testkit';
import { answerParent } from './child.js';

let delayMs = 0;
let stall = false;
let inFlight = new Map<string, number>();
let peaks = new Map<string, number>();
let answered = 0;

const tenantOf = (r: StandInRequest) => {
  const last = [...r.messages].reverse().find((m) => m.role === 'user');
  return String(typeof last?.content === 'string' ? last.content : JSON.stringify(last?.content)).split(
    ' ',
  )[0]!;
};

const provider = await startProviderStandIn({
  reply: async (request) => {
    if (stall) return { stall: true };
    const tenant = tenantOf(request);
    const now = (inFlight.get(tenant) ?? 0) + 1;
    inFlight.set(tenant, now);
    if (now > (peaks.get(tenant) ?? 0)) peaks.set(tenant, now);
    // A 0 ms answer still leaves the event loop once, as a provider's reply would.
    await sleep(delayMs);
    inFlight.set(tenant, inFlight.get(tenant)! - 1);
    answered++;
    return { text: 'done', usage: { input: 10, output: 1 } };
  },
});

answerParent(
  { url: provider.url },
  {
    mode: (m) => {
      delayMs = Number(m.delayMs ?? 0);
      stall = m.stall === true;
      inFlight = new Map();
      peaks = new Map();
      answered = 0;
    },
    peaks: () => ({ peaks: Object.fromEntries(peaks), answered }),
    stop: () => provider.close(),
  },
);
