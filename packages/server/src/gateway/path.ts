import { badPath } from './errors.js';

/** Where the gateways live under the server's origin. */
export const GATEWAY_PREFIX = '/api/client/v1/gateway/';

/** Bytes a request target may hold here: visible ASCII, no spaces, no controls. */
const VISIBLE = /^[\x21-\x7e]*$/;

/**
 * The upstream path of a request: `basePath` and the rest of the caller's path after the
 * gateway's name, with its query, joined as text. Never URL resolution: the upstream's host
 * and port come from the config alone, and the path cannot climb out of `basePath`, since a
 * segment that is `.` or `..` (spelled plain or percent-encoded), an empty segment (`//`), a
 * backslash or an encoded slash is refused with 400.
 */
export function upstreamPath(rawUrl: string, basePath: string): string {
  if (!rawUrl.startsWith(GATEWAY_PREFIX)) throw badPath('does not start with the gateway prefix');
  const afterName = rawUrl.indexOf('/', GATEWAY_PREFIX.length);
  const mark = rawUrl.indexOf('?');
  if (afterName < 0 || (mark >= 0 && mark < afterName)) throw badPath('names no route of the gateway');
  const rest = rawUrl.slice(afterName);
  if (!VISIBLE.test(rest)) throw badPath('holds spaces or control characters');
  const pathEnd = rest.indexOf('?');
  const path = pathEnd < 0 ? rest : rest.slice(0, pathEnd);
  const segments = path.split('/');
  for (let i = 1; i < segments.length; i++) {
    const segment = segments[i]!;
    if (segment === '' && i < segments.length - 1) throw badPath('holds an empty segment (`//`)');
    const plain = segment.replace(/%2e/gi, '.');
    if (plain === '.' || plain === '..') throw badPath('holds a `.` or `..` segment');
    if (/\\|%5c|%2f/i.test(segment)) throw badPath('holds a backslash or an encoded slash');
  }
  return basePath + rest;
}
