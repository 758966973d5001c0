import type { ServerResponse } from 'node:http';
import type { Reply, RequestRecord, StandInRequest } from './types.js';

/** What both wire protocols share: faults, JSON replies, usage figures, a cut connection. */

export function sendJson(
  res: ServerResponse,
  record: RequestRecord,
  status: number,
  body: unknown,
  headers: Record<string, string> = {},
): void {
  record.status = status;
  res.writeHead(status, { 'content-type': 'application/json', ...headers });
  record.done = true;
  res.end(JSON.stringify(body));
}

/**
 * Answers a fault reply (a connection dropped before any response, or an HTTP error with the
 * protocol's error body) and returns true; returns false for any other reply.
 */
export function writeFault(
  answer: Reply,
  res: ServerResponse,
  record: RequestRecord,
  errorBody: (status: number, message: string) => unknown,
): boolean {
  if ('drop' in answer && answer.drop === 'before-response') {
    res.socket?.destroy();
    return true;
  }
  if (!('status' in answer)) return false;
  const headers: Record<string, string> = {};
  if (answer.retryAfterSeconds !== undefined) headers['retry-after'] = String(answer.retryAfterSeconds);
  sendJson(
    res,
    record,
    answer.status,
    errorBody(answer.status, answer.message ?? `stand-in error ${answer.status}`),
    headers,
  );
  return true;
}

/** Token counts of a reply: the ones it gives, or rough ones from the sizes. */
export function usageOf(
  answer: Reply,
  request: StandInRequest,
  text: string,
): { input: number; output: number } {
  if ('usage' in answer && answer.usage) return answer.usage;
  return { input: JSON.stringify(request.messages).length >> 2, output: Math.max(1, text.length >> 2) };
}

/** Lets what was written reach the client, then cuts the connection mid-stream. */
export async function cutAfterFlush(res: ServerResponse): Promise<void> {
  await new Promise<void>((resolve) => res.write('', () => setTimeout(resolve, 5)));
  res.socket?.destroy();
}
