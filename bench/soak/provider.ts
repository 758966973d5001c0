/**
 * The soak's model provider: the stand-in as an account with limits, answering each run with a
 * call of the `mark` tool (so the receiver learns which run executed where) and then a text.
 * Most answers take 5-60 ms; one in LONG_SHARE takes seconds, so some requests are in flight
 * across a fault (a lease running out, a database away, a process killed).
 * While a provider fault is on, a share of its answers are that fault: a 429 with retry-after,
 * a 500, or a stream dropped in the middle.
 */
import { startProviderStandIn, type ProviderStandIn, type Reply, type StandInRequest } from '@sluice/testkit';
import type { Random } from './random.js';

export type ProviderFault = 'provider_429' | 'provider_500' | 'provider_drop';

export interface SoakProvider {
  readonly standIn: ProviderStandIn;
  /** Turns a fault on (a share of answers) or off (undefined). */
  fault(kind: ProviderFault | undefined): void;
}

const textOf = (content: unknown): string =>
  typeof content === 'string'
    ? content
    : Array.isArray(content)
      ? content.map((part: { text?: string }) => part.text ?? '').join('')
      : '';

/** Answers the last message: a user's turn gets a `mark` call with its text, a tool result the answer. */
function answer(request: StandInRequest): Reply {
  const last = request.messages[request.messages.length - 1];
  if (last?.role === 'tool') return { text: `done ${textOf(last.content)}`, usage: { input: 40, output: 4 } };
  const token = textOf(last?.content).trim();
  return { toolCalls: [{ name: 'mark', arguments: { token } }], usage: { input: 40, output: 8 } };
}

/** The share of answers that take seconds, and how long. */
export const LONG_SHARE = 0.06;
export const LONG_MS = { min: 1500, max: 8000 };

export async function startSoakProvider(
  random: Random,
  limits: { maxConcurrent: number },
): Promise<SoakProvider> {
  let current: ProviderFault | undefined;
  const standIn = await startProviderStandIn({
    latencyMs: () => (random.next() < LONG_SHARE ? random.int(LONG_MS.min, LONG_MS.max) : random.int(5, 60)),
    // The account allows more at once than the limiter: what it sees above the limiter's limit
    // is counted by its peak, not refused, so the soak can tell how far over it went.
    limits: {
      maxConcurrent: limits.maxConcurrent * 4,
      requestsPerMinute: 100_000,
      tokensPerMinute: 10_000_000,
    },
    reply(request) {
      if (current && random.next() < 0.35) {
        if (current === 'provider_429')
          return { status: 429, retryAfterSeconds: 1, message: 'soak: slow down' };
        if (current === 'provider_500') return { status: 500, message: 'soak: provider error' };
        if (request.stream) return { drop: 'mid-stream' };
        return { drop: 'before-response' };
      }
      return answer(request);
    },
  });
  return {
    standIn,
    fault(kind) {
      current = kind;
    },
  };
}
