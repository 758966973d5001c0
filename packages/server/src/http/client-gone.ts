import type { FastifyReply } from 'fastify';

/** A signal that aborts when the client goes away before it was answered (or has already gone). */
export function clientGone(reply: FastifyReply): AbortSignal {
  const controller = new AbortController();
  const left = () => {
    if (!reply.raw.writableFinished) controller.abort();
  };
  if (reply.raw.destroyed) left();
  else reply.raw.once('close', left);
  return controller.signal;
}

/**
 * `clientGone`, made when first asked for: a request refused before it needs the signal (most
 * 429s) makes no AbortController (a tenth of a refusal's cost in the server).
 */
export function lazyClientGone(reply: FastifyReply): () => AbortSignal {
  let signal: AbortSignal | undefined;
  return () => (signal ??= clientGone(reply));
}
