import { Transport, type CallOptions, type ClientOptions } from './http.js';
import { runCalls } from './runs.js';
import { threadCalls } from './threads.js';
import type { QueueFigures } from './types.js';

export { RateLimitError, SluiceError, type ErrorBody } from './errors.js';
export type { CallOptions, ClientOptions } from './http.js';
export type * from './types.js';
export type { paths } from './generated/openapi.js';

/**
 * A client of the Sluice run server. Every call takes `{ signal }`; errors are `SluiceError`
 * (a 429 is a `RateLimitError`), and a 429 or 503 is tried again after its Retry-After, up to
 * `maxRetries` times.
 *
 * @example
 * const sluice = createClient({ baseUrl: 'http://127.0.0.1:8787', token });
 * for await (const e of sluice.runs.stream('writer', { input: 'tides' }))
 *   if (e.event === 'message.delta') process.stdout.write(e.data.text);
 */
export function createClient(options: ClientOptions) {
  const t = new Transport(options);
  return {
    runs: runCalls(t),
    threads: threadCalls(t),
    /** The tenant's queues: running, queued and scheduled runs per class, with their limits. */
    queue: (call?: CallOptions) => t.json<QueueFigures>('GET', '/agents/runs/queue', undefined, call),
  };
}

export type SluiceClient = ReturnType<typeof createClient>;
