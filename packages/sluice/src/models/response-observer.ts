import { AsyncLocalStorage } from 'node:async_hooks';
import { providerFetch } from './provider-fetch.js';

/** Called with the status and headers of each HTTP response a provider request receives. */
export type ResponseObserver = (status: number, headers: Headers) => void;

const observers = new AsyncLocalStorage<ResponseObserver>();
let installed = false;

/**
 * Runs `body` (which sends a provider request) so that `observer` sees the status and headers
 * of its HTTP responses, error responses included. pi-ai passes only the message of a failed
 * response on, and the provider SDKs build their clients after an await, so the headers we
 * need (`retry-after`, the rate-limit figures) are read here: `fetch` is wrapped once, and the
 * wrapper only looks at responses of calls made inside an observed async context. Everything
 * else passes straight through, untouched.
 *
 * Inside an observed context every HTTP response that is not a 2xx also comes back marked
 * `x-should-retry: false`, which the OpenAI and Anthropic SDKs both honour before their own
 * status rules. So an SDK given `maxRetries` retries only a connection that failed before any
 * response (inside the same slot, as the spec wants), and a 429 or 5xx always reaches our
 * retry policy, which tells the limiter and takes a new slot: the SDK never retries an
 * overloaded provider behind the limiter's back.
 *
 * A request made inside an observed context is sent by `providerFetch` (undici's `request`, a
 * `Response` built from its answer), not by Node's `fetch`: the same answer for a fraction of
 * the CPU, on every model call.
 */
export function observeResponses<T>(observer: ResponseObserver, body: () => T): T {
  install();
  return observers.run(observer, body);
}

function install(): void {
  if (installed || typeof globalThis.fetch !== 'function') return;
  installed = true;
  const original = globalThis.fetch;
  const fast = providerFetch((input, init) => original.call(globalThis, input, init));
  globalThis.fetch = function observedFetch(
    input: Parameters<typeof fetch>[0],
    init?: Parameters<typeof fetch>[1],
  ) {
    const observer = observers.getStore();
    if (!observer) return original.call(globalThis, input, init);
    return fast(input, init).then((r) => {
      try {
        observer(r.status, r.headers);
      } catch {
        // An observer cannot break a request.
      }
      // The SDKs ask whether to retry only a response that is not ok: a 2xx goes on untouched.
      return r.ok ? r : withoutSdkRetry(r);
    });
  } as typeof fetch;
}

/** The same response (its body still a stream), with `x-should-retry: false` among its headers. */
function withoutSdkRetry(response: Response): Response {
  const headers = new Headers(response.headers);
  headers.set('x-should-retry', 'false');
  return new Response(response.body, { status: response.status, statusText: response.statusText, headers });
}
