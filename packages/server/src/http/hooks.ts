import type { FastifyReply, FastifyRequest, onRequestHookHandler } from 'fastify';

/**
 * A synchronous `onRequest` check as a callback hook. Fastify makes and awaits a promise for
 * every async hook on every request; a check that never waits has no need of one.
 */
export function onRequestCheck(
  check: (request: FastifyRequest, reply: FastifyReply) => void,
): onRequestHookHandler {
  return function (request, reply, done) {
    try {
      check(request, reply);
    } catch (error) {
      done(error as Error);
      return;
    }
    done();
  };
}
