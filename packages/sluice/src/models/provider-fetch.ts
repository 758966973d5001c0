import { STATUS_CODES } from 'node:http';
import type { Readable } from 'node:stream';
import { createBrotliDecompress, createGunzip, createInflate } from 'node:zlib';
import { request, type Dispatcher } from 'undici';

/**
 * `fetch` for provider requests, sent with undici's `request` and answered as a WHATWG
 * `Response`, which is what the provider SDKs read. Node's own `fetch` is undici's `fetch`, and
 * on this project's machines it cost about 500 µs of CPU per call more than `request` (a loopback
 * stream of four events: 510 to 670 µs a call against 124 to 160 µs for this path, which builds
 * the same `Response`). Every model call of every run pays that, on its first text's path.
 *
 * What a caller of `fetch` relies on is kept:
 *   - the dispatcher: undici's global one, which Node's `fetch` uses too (a proxy set with
 *     `setGlobalDispatcher` applies to both);
 *   - redirects are followed, by handing the request to `fetch` itself (a provider answering a
 *     model call with a redirect is rare enough that its cost does not matter);
 *   - an abort rejects with the signal's reason, a failure before the answer with
 *     `TypeError('fetch failed')` (its cause the network error), a failure of the body with
 *     `TypeError('terminated')`, as `fetch` does;
 *   - a compressed answer is decompressed (`fetch` asks for gzip, deflate and br; this path asks
 *     for nothing, but a server may compress all the same).
 * A request this path does not handle as `fetch` would (a `Request` object, a streamed or form
 * body, `redirect` other than `follow`) goes to `fetch` unchanged.
 */
export function providerFetch(fallback: typeof fetch): typeof fetch {
  return async function fastFetch(input, init) {
    const target = typeof input === 'string' ? input : input instanceof URL ? input.href : undefined;
    const body = init?.body;
    if (
      target === undefined ||
      !/^https?:/i.test(target) ||
      (init?.redirect !== undefined && init.redirect !== 'follow') ||
      !(body === undefined || body === null || typeof body === 'string' || body instanceof Uint8Array)
    )
      return fallback(input, init);
    const signal = init?.signal ?? undefined;
    const answer = await answered(
      request(target, {
        method: methodOf(init?.method),
        headers: headerPairs(init?.headers, typeof body === 'string'),
        body: body ?? undefined,
        signal,
      }),
      signal,
    );
    const status = answer.statusCode;
    if (REDIRECTS.has(status) && answer.headers.location !== undefined) {
      discard(answer.body);
      return fallback(input, init);
    }
    const headers = new Headers();
    for (const [name, value] of Object.entries(answer.headers)) {
      if (value === undefined) continue;
      if (Array.isArray(value)) for (const v of value) headers.append(name, v);
      else headers.append(name, value);
    }
    const response = new Response(NULL_BODY.has(status) ? discard(answer.body) : webBody(answer, signal), {
      status,
      statusText: STATUS_CODES[status] ?? '',
      headers,
    });
    Object.defineProperty(response, 'url', { value: target });
    return response;
  } as typeof fetch;
}

/**
 * The answer's head, or the failure `fetch` would give: an abort rejects in the abort's own turn
 * with the signal's reason (undici's own rejection comes a turn later), a network failure as
 * `TypeError('fetch failed')`.
 */
function answered(
  sent: Promise<Dispatcher.ResponseData>,
  signal: AbortSignal | undefined,
): Promise<Dispatcher.ResponseData> {
  return new Promise((resolve, reject) => {
    const onAbort = () => reject(signal!.reason);
    signal?.addEventListener('abort', onAbort, { once: true });
    sent.then(
      (answer) => {
        signal?.removeEventListener('abort', onAbort);
        if (signal?.aborted) {
          discard(answer.body);
          reject(signal.reason);
        } else resolve(answer);
      },
      (error: unknown) => {
        signal?.removeEventListener('abort', onAbort);
        reject(signal?.aborted ? signal.reason : new TypeError('fetch failed', { cause: error }));
      },
    );
  });
}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);
/** Statuses a `Response` must have no body for. */
const NULL_BODY = new Set([101, 103, 204, 205, 304]);

/** As `fetch` normalizes a method: the standard ones in capitals, any other as given. */
function methodOf(method: string | undefined): Dispatcher.HttpMethod {
  if (method === undefined) return 'GET';
  const upper = method.toUpperCase();
  return (STANDARD_METHODS.has(upper) ? upper : method) as Dispatcher.HttpMethod;
}
const STANDARD_METHODS = new Set(['DELETE', 'GET', 'HEAD', 'OPTIONS', 'POST', 'PUT']);

/** The request's headers as name-value pairs; a text body without a type is typed as `fetch` types it. */
function headerPairs(headers: RequestInit['headers'], textBody: boolean): string[] {
  const pairs: string[] = [];
  let typed = false;
  if (headers !== undefined) {
    const entries = headers instanceof Headers || Array.isArray(headers) ? headers : Object.entries(headers);
    for (const [name, value] of entries as Iterable<[string, string]>) {
      pairs.push(name, value);
      if (!typed && name.toLowerCase() === 'content-type') typed = true;
    }
  }
  if (textBody && !typed) pairs.push('content-type', 'text/plain;charset=UTF-8');
  return pairs;
}

/**
 * The answer's body as a byte stream, decompressed when the server compressed it. An abort
 * errors the stream in the abort's own turn, as `fetch` does, so a reader learns of it before
 * anything that runs after the abort.
 */
function webBody(
  answer: Dispatcher.ResponseData,
  signal: AbortSignal | undefined,
): ReadableStream<Uint8Array> {
  const source = decoded(answer.body, answer.headers['content-encoding']);
  let ended = false;
  let onAbort: (() => void) | undefined;
  const end = () => {
    ended = true;
    if (onAbort) signal!.removeEventListener('abort', onAbort);
  };
  return new ReadableStream<Uint8Array>({
    start(controller) {
      source.on('data', (chunk: Buffer) => {
        if (ended) return;
        controller.enqueue(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength));
        if ((controller.desiredSize ?? 1) <= 0) source.pause();
      });
      source.once('end', () => {
        if (ended) return;
        end();
        controller.close();
      });
      source.on('error', (error) => {
        if (ended) return;
        end();
        controller.error(signal?.aborted ? signal.reason : new TypeError('terminated', { cause: error }));
      });
      if (signal) {
        onAbort = () => {
          if (ended) return;
          end();
          controller.error(signal.reason);
          destroy(source, answer.body);
        };
        signal.addEventListener('abort', onAbort, { once: true });
      }
      source.pause();
    },
    pull() {
      source.resume();
    },
    cancel() {
      end();
      destroy(source, answer.body);
    },
  });
}

function destroy(source: Readable, body: Readable): void {
  discard(source);
  if (source !== body) discard(body);
}

/** Ends a body nobody will read (undici errors a body destroyed unread: nobody listens for that). */
function discard(body: Readable): null {
  body.on('error', () => undefined);
  body.destroy();
  return null;
}

function decoded(body: Readable, encoding: string | string[] | undefined): Readable {
  const coding = (Array.isArray(encoding) ? encoding.join(',') : (encoding ?? '')).trim().toLowerCase();
  const decoder =
    coding === 'gzip' || coding === 'x-gzip'
      ? createGunzip()
      : coding === 'deflate'
        ? createInflate()
        : coding === 'br'
          ? createBrotliDecompress()
          : undefined;
  if (!decoder) return body;
  body.on('error', (error) => decoder.destroy(error));
  return body.pipe(decoder);
}
