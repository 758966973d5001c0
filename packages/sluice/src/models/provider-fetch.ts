import { getMaxListeners, setMaxListeners } from 'node:events';
import { STATUS_CODES } from 'node:http';
import { pipeline, Transform, type Readable } from 'node:stream';
import { constants, createBrotliDecompress, createGunzip, createInflate, createInflateRaw } from 'node:zlib';
import { request, type Dispatcher } from 'undici';

/**
 * `fetch` for provider requests, sent with undici's `request` and answered as a WHATWG
 * `Response`, which is what the provider SDKs read. Node's own `fetch` is undici's `fetch`, and
 * on this project's machines it cost about 500 µs of CPU per call more than `request` (a loopback
 * stream of four events: 510 to 670 µs a call against 124 to 160 µs for this path, which builds
 * the same `Response`). Every model call of every run pays that, on its first text's path.
 *
 * What a caller of `fetch` relies on is kept:
 *   - the dispatcher: undici's global one, shared with Node's `fetch` (a proxy set with
 *     `setGlobalDispatcher` applies to both). Loading undici puts its own agent there when none
 *     is set yet, so Node's `fetch` in the same process then runs on undici 7's agent too;
 *   - redirects are followed, by handing the request to `fetch` itself: the redirecting address
 *     hears the request twice (a provider redirecting a model call is rare enough for that);
 *   - an abort rejects with the signal's reason, a failure before the answer with
 *     `TypeError('fetch failed')` (its cause the network error, or a status outside 200 to
 *     599, which a `Response` cannot carry), a failure of the body with `TypeError('terminated')`;
 *   - a compressed answer is decoded as `fetch` decodes it (this path asks for no compression,
 *     but a server or a proxy may compress all the same), and HEAD, 204, 205 and 304 have no body.
 * What differs: `statusText` is the standard text of the status, not the server's reason phrase;
 * no `user-agent` or `accept-encoding` is added (the SDKs send their own user agent). A request
 * this path does not send as `fetch` would (a `Request` object, a streamed or form body,
 * `redirect` other than `follow`, a scheme other than http and https) goes to `fetch` unchanged.
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
    // Each request in flight listens on the signal, as fetch's do: so does fetch raise its limit.
    if (signal && getMaxListeners(signal) < SIGNAL_LISTENERS) setMaxListeners(SIGNAL_LISTENERS, signal);
    const method = methodOf(init?.method);
    const answer = await answered(
      request(target, {
        method,
        headers: headerPairs(init?.headers, typeof body === 'string'),
        body: body ?? undefined,
        signal,
      }),
      signal,
    );
    const status = answer.statusCode;
    if (REDIRECTS.has(status) && answer.headers.location !== undefined) {
      // Sent again by fetch, which follows it: the redirecting address hears the request twice.
      discard(answer.body);
      return fallback(input, init);
    }
    if (status < 200 || status > 599) {
      // A Response cannot carry it (fetch's own can): a broken answer, as a failed connection.
      discard(answer.body);
      throw new TypeError('fetch failed', {
        cause: new RangeError(`status ${status} is not an HTTP status`),
      });
    }
    const headers = new Headers();
    for (const [name, value] of Object.entries(answer.headers)) {
      if (value === undefined) continue;
      if (Array.isArray(value)) for (const v of value) headers.append(name, v);
      else headers.append(name, value);
    }
    const bodiless = method === 'HEAD' || NULL_BODY.has(status);
    const response = new Response(bodiless ? discard(answer.body) : webBody(answer, signal), {
      status,
      statusText: STATUS_CODES[status] ?? '',
      headers,
    });
    Object.defineProperty(response, 'url', { value: target });
    return response;
  } as typeof fetch;
}

/** What fetch raises an AbortSignal's listener limit to. */
const SIGNAL_LISTENERS = 1500;

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
    // Headers (any implementation), an array of pairs, a Map: pairs; anything else a record.
    const entries =
      typeof (headers as Partial<Iterable<unknown>>)[Symbol.iterator] === 'function'
        ? (headers as Iterable<[string, string]>)
        : Object.entries(headers);
    for (const [name, value] of entries) {
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

/**
 * The body as the server sent it, decoded as fetch decodes it: the codings in reverse order, at
 * most five, leniently (a body cut short or empty still gives what it has), `deflate` with or
 * without its zlib header; a coding it does not know leaves the body as it is. A decoder's
 * failure ends the request too.
 */
function decoded(body: Readable, encoding: string | string[] | undefined): Readable {
  const codings = (Array.isArray(encoding) ? encoding.join(',') : (encoding ?? ''))
    .toLowerCase()
    .split(',')
    .map((c) => c.trim())
    .filter((c) => c !== '' && c !== 'identity');
  if (codings.length === 0) return body;
  if (codings.length > 5) {
    const refused = new Transform();
    refused.destroy(new Error(`${codings.length} content codings, more than 5`));
    body.destroy();
    return refused;
  }
  const decoders: Transform[] = [];
  for (const coding of codings.reverse()) {
    const decoder = decoderOf(coding);
    if (!decoder) return body;
    decoders.push(decoder);
  }
  return pipeline([body, ...decoders], () => undefined) as unknown as Readable;
}

const LENIENT = { flush: constants.Z_SYNC_FLUSH, finishFlush: constants.Z_SYNC_FLUSH };

function decoderOf(coding: string): Transform | undefined {
  if (coding === 'gzip' || coding === 'x-gzip') return createGunzip(LENIENT);
  if (coding === 'br')
    return createBrotliDecompress({
      flush: constants.BROTLI_OPERATION_FLUSH,
      finishFlush: constants.BROTLI_OPERATION_FLUSH,
    });
  if (coding === 'deflate') return inflateEither();
  return undefined;
}

/** `deflate` as servers send it: zlib-wrapped (as the standard says) or raw, told by its first byte. */
function inflateEither(): Transform {
  let inner: Transform | undefined;
  const outer: Transform = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      if (!inner) {
        if (chunk.length === 0) return done();
        inner = (chunk[0]! & 0x0f) === 0x08 ? createInflate(LENIENT) : createInflateRaw(LENIENT);
        inner.on('data', (data: Buffer) => outer.push(data));
        inner.on('error', (error) => outer.destroy(error));
      }
      inner.write(chunk, done);
    },
    flush(done) {
      if (!inner) return done();
      inner.once('end', () => done());
      inner.end();
    },
    destroy(error, done) {
      inner?.destroy();
      done(error);
    },
  });
  return outer;
}
