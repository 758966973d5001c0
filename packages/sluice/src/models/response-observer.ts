import { AsyncLocalStorage } from 'node:async_hooks';

/** Called with the status and headers of each HTTP response a provider request receives. */
export type ResponseObserver = (status: number, headers: Headers) => void;

const observers = new AsyncLocalStorage<ResponseObserver>();
let installed = false;

/**
 * Runs `body` (which sends a provider request) so that `observer` sees the status and headers
 * of its HTTP responses, error responses included. pi-ai passes only the message of a failed
 * response on, and the provider SDKs build their clients after an await, so the headers we
 * need (`retry-after`) are read here: `fetch` is wrapped once, and the wrapper only looks at
 * responses of calls made inside an observed async context. Everything else passes straight
 * through, untouched.
 */
export function observeResponses<T>(observer: ResponseObserver, body: () => T): T {
  install();
  return observers.run(observer, body);
}

function install(): void {
  if (installed || typeof globalThis.fetch !== 'function') return;
  installed = true;
  const original = globalThis.fetch;
  globalThis.fetch = function observedFetch(
    input: Parameters<typeof fetch>[0],
    init?: Parameters<typeof fetch>[1],
  ) {
    const observer = observers.getStore();
    const response = original.call(globalThis, input, init);
    if (observer) {
      response.then(
        (r) => {
          try {
            observer(r.status, r.headers);
          } catch {
            // An observer cannot break a request.
          }
        },
        () => undefined,
      );
    }
    return response;
  } as typeof fetch;
}
