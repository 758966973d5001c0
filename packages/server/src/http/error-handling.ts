import type { FastifyError, FastifyInstance, FastifyRequest } from 'fastify';
import { badRequest, HttpError, isStoreUnavailable, notFound, refusalOf, shown } from './errors.js';
import { expectations, patternMeanings } from './schemas.js';

// How errors are answered: the app's error, framework-error and 404 handlers, and Fastify's
// own request errors (a body that is not JSON, a schema it fails, a bad header) in the API's
// error shape, naming the field, the rule and the value that broke it.

/** Fastify's own request errors, in our body, with a status and type a client can act on. */
export function frameworkError(error: FastifyError, request?: FastifyRequest): HttpError {
  // Only Fastify's own errors carry a status; anything else is a fault of ours (a 500, logged).
  const status = error.statusCode ?? 500;
  switch (error.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return new HttpError(413, 'request_too_large', 'The request body is over the limit of 10 MB', {
        limit: 'body_bytes',
        limit_value: 10 * 1024 * 1024,
      });
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return new HttpError(415, 'unsupported_media_type', 'Send the body as application/json');
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return badRequest('The body is not as long as its Content-Length says');
    case 'FST_ERR_BAD_URL':
      return badRequest('The URL is not valid: a percent-encoded part of it is not UTF-8');
    case 'FST_ERR_MAX_PARAM_LENGTH':
      return notFound('No such resource: a part of the path is too long to name anything');
    default:
      if (error.validation) return validationError(error, request);
      if (status >= 400 && status < 500) return new HttpError(status, 'invalid_request', error.message);
      return new HttpError(500, 'internal_error', 'internal error');
  }
}

type SchemaError = NonNullable<FastifyError['validation']>[number] & { propertyName?: string };

/** The value a schema error points at, in the part of the request that was validated. */
function valueAt(request: FastifyRequest | undefined, context: string, instancePath: string): unknown {
  const parts: Record<string, unknown> = {
    body: request?.body,
    querystring: request?.query,
    params: request?.params,
    headers: request?.headers,
  };
  let value = parts[context];
  for (const raw of instancePath.split('/').slice(1)) {
    const key = raw.replace(/~1/g, '/').replace(/~0/g, '~');
    if (value === null || typeof value !== 'object' || !Object.hasOwn(value, key)) return undefined;
    value = (value as Record<string, unknown>)[key];
  }
  return value;
}

/**
 * A schema failure, naming the field, the rule and (briefly) the value. Of the errors at the
 * deepest path, a broken rule of a form the value has (a string too long) says more than the
 * forms it does not have (not a number): alternatives (anyOf) are described as a whole only
 * when the value has none of their forms.
 */
function validationError(error: FastifyError, request?: FastifyRequest): HttpError {
  const errors = error.validation as SchemaError[];
  const depth = (e: SchemaError) => e.instancePath.split('/').length;
  const deepest = Math.max(...errors.map(depth));
  const here = errors.filter((e) => depth(e) === deepest);
  const first =
    here.find((e) => e.keyword !== 'type' && e.keyword !== 'anyOf') ??
    here.find((e) => e.keyword === 'anyOf') ??
    here[0]!;
  const context = error.validationContext ?? 'body';
  const path = first.instancePath
    .split('/')
    .slice(1)
    .map((k) => k.replace(/~1/g, '/').replace(/~0/g, '~'))
    .join('.');
  const params = first.params as Record<string, unknown>;
  let field = path;
  if (first.keyword === 'additionalProperties')
    field = [path, String(params.additionalProperty)].filter(Boolean).join('.');
  if (first.keyword === 'required') field = [path, String(params.missingProperty)].filter(Boolean).join('.');
  const where = field ? `\`${field}\`` : `the ${context}`;
  const value = valueAt(request, context, first.instancePath);
  const got = value === undefined ? '' : `, got \`${shown(value)}\``;
  let message: string;
  if (first.propertyName !== undefined) {
    // A rule on the keys of an object (metadata): the key is the value to show.
    message = `Expected the keys of ${where} to ${describe(first.keyword, params, first.message)}, got \`${shown(first.propertyName)}\``;
  } else {
    switch (first.keyword) {
      case 'additionalProperties':
        message = `Unknown field \`${field}\` in the ${context}`;
        break;
      case 'required':
        message = `Expected ${where} in the ${context}`;
        break;
      case 'anyOf':
        message = `Expected ${where} to ${expectationOf(field, first.message)}${got}`;
        break;
      case 'pattern':
        message = `Expected ${where} to ${patternMeanings[String(params.pattern)] ?? expectationOf(field, first.message)}${got}`;
        break;
      case 'maxProperties':
      case 'minProperties':
        message = `Expected ${where} to ${describe(first.keyword, params)}, got ${Object.keys(value ?? {}).length}`;
        break;
      case 'maxItems':
      case 'minItems':
        message = `Expected ${where} to ${describe(first.keyword, params)}, got ${Array.isArray(value) ? value.length : 0}`;
        break;
      default:
        message = `Expected ${where} to ${describe(first.keyword, params, first.message)}${got}`;
    }
  }
  return badRequest(message, { field: field || context });
}

/** What a field with alternatives or a pattern expects: its own words, else its parent's. */
function expectationOf(field: string, fallback?: string): string {
  const parts = field.split('.');
  const wildcard = [...parts.slice(0, -1), '*'].join('.');
  return (
    expectations[field] ??
    expectations[wildcard] ??
    expectations[parts.at(-1)!] ??
    fallback ??
    'match one of its documented forms'
  );
}

function describe(keyword: string, params: Record<string, unknown>, fallback?: string): string {
  const n = Number(params.limit);
  const plural = (word: string) => `${n} ${word}${n === 1 ? '' : 's'}`;
  switch (keyword) {
    case 'maxLength':
      return `be at most ${plural('character')}`;
    case 'minLength':
      return `be at least ${plural('character')}`;
    case 'maxItems':
      return `have at most ${plural('item')}`;
    case 'minItems':
      return `have at least ${plural('item')}`;
    case 'maxProperties':
      return `have at most ${plural('key')}`;
    case 'minProperties':
      return `have at least ${plural('key')}`;
    case 'maximum':
      return `be at most ${n}`;
    case 'minimum':
      return `be at least ${n}`;
    case 'enum':
      return `be one of ${(params.allowedValues as unknown[]).map((v) => JSON.stringify(v)).join(', ')}`;
    case 'type':
      return `be of type ${String(params.type)}`;
    case 'format':
      return `be a valid RFC 3339 ${String(params.format)}`;
    case 'pattern':
      return patternMeanings[String(params.pattern)] ?? fallback ?? 'be valid';
    default:
      return fallback ?? 'be valid';
  }
}

type Log = (level: 'warn' | 'error', message: string, fields?: object) => void;

/** The one error handler, the framework-error handler and the 404 handler, all in the API shape. */
export function installErrorHandling(fastify: FastifyInstance, log: Log): void {
  const send = (
    reply: { status(n: number): { headers(h: object): { send(b: unknown): unknown } } },
    error: HttpError,
  ) => reply.status(error.status).headers(error.headers).send(error.body());
  fastify.setErrorHandler((error: FastifyError | HttpError, request, reply) => {
    const refused = refusalOf(error);
    if (refused) return send(reply, refused);
    if (isStoreUnavailable(error)) {
      log('warn', 'database unavailable', { reqId: request.id, error: String(error) });
      return send(
        reply,
        new HttpError(
          503,
          'store_unavailable',
          'The server cannot reach its database; try again shortly',
          {},
          {
            'retry-after': '5',
          },
        ),
      );
    }
    const mapped = frameworkError(error as FastifyError, request);
    if (mapped.status >= 500)
      log('error', 'request failed', { reqId: request.id, error: (error as Error).stack });
    // Replying before a body was read: close the connection rather than read the rest of it.
    if (mapped.status === 413) reply.header('connection', 'close');
    return send(reply, mapped);
  });
  fastify.setNotFoundHandler((request, reply) =>
    send(reply, notFound(`No route ${request.method} ${shown(request.url.split('?')[0], 200)}`)),
  );
}
