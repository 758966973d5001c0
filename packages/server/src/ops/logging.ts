import { randomUUID } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { FastifyInstance, FastifyServerOptions } from 'fastify';
import { onRequestCheck } from '../http/hooks.js';

/**
 * The server's logs: pino JSON lines through Fastify's logger, each line of a request carrying
 * its id (`reqId`), and nothing in them that would let a reader of the logs act as a tenant or
 * read its prompts. Three layers keep secrets out:
 * - what is logged of a request is chosen (method, path, host, address), never its headers or
 *   body, and its query string is logged with its values replaced;
 * - pino's redaction covers the paths where a secret would sit if someone logged more;
 * - every line is scrubbed on its way out of bearer tokens, Sluice token secrets, credentials in
 *   URLs and secret query values, wherever in the line a message put them.
 * Prompt text is kept out by never logging a body or a run's input; no pattern could find it.
 */

/** The header a request id is taken from, and echoed in. */
export const requestIdHeader = 'x-request-id';

/** A caller's id is kept only when it is this short and made of these characters. */
const SAFE_REQUEST_ID = /^[A-Za-z0-9._:-]{1,64}$/;

/**
 * The id of a request: the caller's `X-Request-Id` when it is short and plain (so a proxy's id
 * ties the lines together), else a new UUID, so a header cannot put line breaks, markup or a
 * megabyte into every line of a request.
 */
export function requestIdOf(request: IncomingMessage): string {
  const given = request.headers[requestIdHeader];
  return typeof given === 'string' && SAFE_REQUEST_ID.test(given) ? given : randomUUID();
}

/**
 * A request URL as logged: the path, and the query's keys with every value blanked. A query
 * value may be a token (the WebSocket route takes `?access_token=`) or text a client typed, and
 * the keys alone tell what was asked.
 */
export function loggedUrl(url: string): string {
  const mark = url.indexOf('?');
  if (mark < 0) return url;
  const query = url
    .slice(mark + 1)
    .split('&')
    .map((pair) => (pair.includes('=') ? `${pair.slice(0, pair.indexOf('='))}=[redacted]` : pair))
    .join('&');
  return `${url.slice(0, mark)}?${query}`;
}

/** Patterns scrubbed from every written line, with what replaces them. */
const SCRUBS: readonly [RegExp, string][] = [
  // `Bearer <token>` in any header or message.
  [/(bearer\s+)[^\s"'\\,;]+/gi, '$1[redacted]'],
  // Sluice token secrets (sk_ and 32 base64url characters), wherever they appear.
  [/\bsk_[A-Za-z0-9_-]{16,}/g, 'sk_[redacted]'],
  // Signing secrets (whsec_ and base64), of callbacks and webhook triggers.
  [/\bwhsec_[A-Za-z0-9+/=_-]{8,}/g, 'whsec_[redacted]'],
  // `Basic <user:password in base64>`, as a proxy or a client may send it.
  [/(\bBasic\s+)[A-Za-z0-9+/=]{8,}/g, '$1[redacted]'],
  // user:password@ in a connection string (DATABASE_URL, REDIS_URL).
  [/(\b[a-z][a-z0-9+.-]*:\/\/[^\s/:@"']*:)[^\s@/"']+@/gi, '$1[redacted]@'],
  // A secret-looking query value in a URL inside a message.
  [
    /([?&](?:[A-Za-z0-9_.-]*(?:token|secret|key|sig|password|auth|credential|code)[A-Za-z0-9_.-]*)=)[^&\s"'#]+/gi,
    '$1[redacted]',
  ],
];

/** A log line with the secrets of SCRUBS replaced. */
export function scrubLine(line: string): string {
  let out = line;
  for (const [pattern, replacement] of SCRUBS) out = out.replace(pattern, replacement);
  return out;
}

const secretFields = [
  'authorization',
  'password',
  'secret',
  'token',
  'signing_secret',
  'webhook_secret',
  'databaseUrl',
  'redisUrl',
  'DATABASE_URL',
  'REDIS_URL',
  'input',
  'prompt',
  'instructions',
  'messages',
  'body',
];

/** Where a secret would sit in a logged object (at the top or one level down); pino writes `[redacted]` there. */
export const redactPaths = [
  'req.headers.authorization',
  'req.headers.cookie',
  'req.headers["x-api-key"]',
  'req.headers["webhook-signature"]',
  'req.headers["x-hub-signature-256"]',
  'headers.cookie',
  ...secretFields,
  ...secretFields.map((field) => `*.${field}`),
];

/** What a request line says of the request: no headers, no body, the query without secrets. */
function serializeRequest(request: {
  method: string;
  url: string;
  host?: string;
  hostname?: string;
  ip?: string;
  socket?: { remotePort?: number };
}) {
  return {
    method: request.method,
    url: loggedUrl(request.url),
    host: request.host ?? request.hostname,
    remoteAddress: request.ip,
    remotePort: request.socket?.remotePort,
  };
}

/**
 * Fastify's logger options: JSON at `level`, redaction and scrubbing as above. `extra` (a test's
 * stream, a level) is merged in, never replacing the redaction.
 */
export function loggerOptions(level: string, extra: Record<string, unknown> = {}) {
  return {
    level,
    ...extra,
    redact: { paths: redactPaths, censor: '[redacted]' },
    serializers: { req: serializeRequest },
    hooks: { streamWrite: scrubLine },
  } satisfies FastifyServerOptions['logger'];
}

/** Echoes each request's id in the response, so a caller can quote it. */
export function installRequestId(fastify: FastifyInstance): void {
  fastify.addHook(
    'onRequest',
    onRequestCheck((request, reply) => {
      reply.header(requestIdHeader, request.id);
    }),
  );
}

/**
 * The app's `logger` option from what a caller gave: `false` stays off; otherwise Sluice's options,
 * with a given level and stream kept (SLUICE_LOG_LEVEL, else info, when no level is given).
 */
export function appLogger(
  given: FastifyServerOptions['logger'],
  env: NodeJS.ProcessEnv = process.env,
): FastifyServerOptions['logger'] {
  if (given === false) return false;
  const level = env.SLUICE_LOG_LEVEL ?? 'info';
  if (given === undefined || given === true) return loggerOptions(level);
  return loggerOptions(given.level ?? level, given as Record<string, unknown>);
}

/** The texts of a stored run input: a string, or the contents of its messages. */
function inputTexts(input: unknown): string[] {
  if (typeof input === 'string') return [input];
  if (!Array.isArray(input)) return input === undefined || input === null ? [] : [JSON.stringify(input)];
  return input.flatMap((m: { content?: unknown }) =>
    typeof m?.content === 'string'
      ? [m.content]
      : Array.isArray(m?.content)
        ? (m.content as { text?: unknown }[]).flatMap((b) => (typeof b?.text === 'string' ? [b.text] : []))
        : [],
  );
}

/**
 * A failure's message with the run's input taken out, for the log. Providers quote the input
 * back in their errors ("cannot answer ..."), whole, cut or escaped, so every word of four or
 * more characters of the input is replaced where it appears; the rest (status, reason) stays.
 */
export function withoutInput(message: string, input: unknown): string {
  const words = new Set(inputTexts(input).flatMap((text) => text.split(/[\s"'\\{}[\],:]+/)));
  let out = message;
  for (const word of [...words].filter((w) => w.length >= 4).sort((a, b) => b.length - a.length)) {
    out = out.split(word).join('[input]');
  }
  return out;
}
