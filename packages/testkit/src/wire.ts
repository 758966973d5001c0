import type { ServerResponse } from 'node:http';
import type { Reply, RequestRecord, StandInRequest } from './types.js';

/** What both wire protocols share: faults, JSON replies, usage figures, a cut connection. */

export const sleep = (ms: number): Promise<void> =>
  ms > 0 ? new Promise((resolve) => setTimeout(resolve, ms)) : Promise.resolve();

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
  return { input: promptTokens(request), output: Math.max(1, text.length >> 2) };
}

/** The stand-in's figure for a request's prompt tokens: a quarter of its messages' JSON. */
export function promptTokens(request: StandInRequest): number {
  return JSON.stringify(request.messages).length >> 2;
}

/** The output-token cap a request sends (`max_tokens`, or OpenAI's `max_completion_tokens`); 0 without one. */
export function outputCap(body: Record<string, unknown>): number {
  const cap = body.max_tokens ?? body.max_completion_tokens;
  return typeof cap === 'number' && Number.isFinite(cap) && cap > 0 ? cap : 0;
}

/** The usage a reply's response reports; undefined for a fault, which reports none. */
export function reportedUsage(
  answer: Reply,
  request: StandInRequest,
): { input: number; output: number } | undefined {
  if ('status' in answer || 'drop' in answer || 'stall' in answer) return undefined;
  return usageOf(answer, request, 'text' in answer ? (answer.text ?? '') : '');
}

/** Lets what was written reach the client, then cuts the connection mid-stream. */
export async function cutAfterFlush(res: ServerResponse): Promise<void> {
  await new Promise<void>((resolve) => res.write('', () => setTimeout(resolve, 5)));
  res.socket?.destroy();
}
