import http from 'node:http';
import https from 'node:https';
import type { LookupAddress, LookupOptions } from 'node:dns';
import type { LookupFunction } from 'node:net';
import type { Clock } from 'sluice/concurrency';
import { forbiddenAddressReason } from './addresses.js';
import type { Resolver } from './destination.js';
import type { AttemptOutcome } from './retry.js';

/** A connect-time lookup answered with an address a callback may not reach. */
export class ForbiddenAddressError extends Error {
  readonly hostname: string;
  readonly address: string;
  constructor(hostname: string, address: string, reason: string) {
    super(`${hostname} resolved to ${address}, ${reason}`);
    this.name = 'ForbiddenAddressError';
    this.hostname = hostname;
    this.address = address;
  }
}

/**
 * A `lookup` for node:net that resolves the name again at connect time and refuses the
 * connection when any address is forbidden. This closes DNS rebinding: a name that was
 * public when the run was created and points inside the network now is never connected to,
 * and the socket connects to the very addresses that were judged.
 */
export function guardedLookup(resolver: Resolver, allowPrivate: boolean): LookupFunction {
  const lookup = (
    hostname: string,
    options: LookupOptions,
    callback: (error: Error | null, address: string | LookupAddress[], family?: number) => void,
  ) => {
    resolver(hostname).then(
      (answers) => {
        if (!allowPrivate) {
          for (const { address } of answers) {
            const reason = forbiddenAddressReason(address);
            if (reason) return callback(new ForbiddenAddressError(hostname, address, reason), '');
          }
        }
        const family = options.family === 'IPv4' ? 4 : options.family === 'IPv6' ? 6 : options.family;
        const usable = answers
          .filter((a) => !family || a.family === family)
          .map((a) => ({ address: a.address, family: a.family }));
        if (usable.length === 0) {
          const error = Object.assign(new Error(`${hostname} has no usable address`), { code: 'ENOTFOUND' });
          return callback(error, '');
        }
        if (options.all) return callback(null, usable);
        return callback(null, usable[0]!.address, usable[0]!.family);
      },
      (error: unknown) => callback(error instanceof Error ? error : new Error(String(error)), ''),
    );
  };
  return lookup as LookupFunction;
}

export interface PostOptions {
  timeoutMs: number;
  resolver: Resolver;
  allowPrivate: boolean;
  clock: Clock;
  /** Aborting ends the attempt at once with `{ kind: 'aborted' }` (the dispatcher stopping). */
  signal: AbortSignal;
}

/**
 * One POST of a callback. Never follows a redirect (node:http has no such feature), never
 * reuses a connection (each attempt resolves and judges the name afresh), and destroys the
 * response as soon as its status is known: the body is of no use, and reading it would let a
 * receiver hold the attempt open.
 */
export function postCallback(
  url: URL,
  headers: Record<string, string>,
  body: string,
  options: PostOptions,
): Promise<AttemptOutcome | { kind: 'aborted' }> {
  return new Promise((resolve) => {
    if (options.signal.aborted) return resolve({ kind: 'aborted' });
    const transport = url.protocol === 'https:' ? https : http;
    const request = transport.request(url, {
      method: 'POST',
      agent: false,
      headers: { ...headers, 'content-length': String(Buffer.byteLength(body)), connection: 'close' },
      lookup: guardedLookup(options.resolver, options.allowPrivate),
    });
    let settled = false;
    const settle = (outcome: AttemptOutcome | { kind: 'aborted' }) => {
      if (settled) return;
      settled = true;
      options.clock.clearTimeout(timer);
      options.signal.removeEventListener('abort', onAbort);
      request.destroy();
      resolve(outcome);
    };
    const onAbort = () => settle({ kind: 'aborted' });
    const timer = options.clock.setTimeout(
      () => settle({ kind: 'timeout', afterMs: options.timeoutMs }),
      options.timeoutMs,
      { background: true },
    );
    options.signal.addEventListener('abort', onAbort, { once: true });
    // Stays attached after settling: destroying the request may still emit an error.
    request.on('error', (error: Error & { code?: string }) => {
      if (error instanceof ForbiddenAddressError) {
        settle({ kind: 'refused', message: `callback_url refused at connect time: ${error.message}` });
      } else {
        settle({ kind: 'network', message: error.code ?? error.message });
      }
    });
    request.on('response', (response) => {
      response.on('error', () => undefined);
      const retryAfter = response.headers['retry-after'];
      response.destroy();
      settle({ kind: 'response', status: response.statusCode ?? 0, retryAfter });
    });
    request.end(body);
  });
}
