import type { FastifyInstance } from 'fastify';
import { badRequest } from './errors.js';

/**
 * JSON bodies through Fastify's own safe parser, which refuses `__proto__` keys and
 * `constructor.prototype` (they could reach an object's prototype in later code). An empty
 * body is no body: `POST .../cancel` with a JSON content type and nothing else is fine.
 * A refusal says why: the syntax error, or the prototype key.
 */
export function installJsonBody(fastify: FastifyInstance): void {
  const parseSafely = fastify.getDefaultJsonParser('error', 'error');
  fastify.removeContentTypeParser('application/json');
  fastify.addContentTypeParser('application/json', { parseAs: 'string' }, (request, body, done) => {
    const text = body as string;
    if (text === '') return done(null, undefined);
    parseSafely(request, text, (error, value) => {
      if (!error) return done(null, value);
      // Only the failing path parses twice, to tell a syntax error from a prototype key.
      try {
        JSON.parse(text);
      } catch (syntax) {
        return done(badRequest(`The body is not valid JSON: ${(syntax as Error).message}`), undefined);
      }
      done(
        badRequest('The body holds a `__proto__` key or a `constructor.prototype`; neither is accepted', {
          field: '__proto__',
        }),
        undefined,
      );
    });
  });
}
