import type { Reply, StandInRequest } from './types.js';

type Responder = (request: StandInRequest) => Reply | Promise<Reply>;

/** Answers with the last user message, prefixed. */
export const echo =
  (prefix = 'Echo: '): Responder =>
  (request) => {
    const last = [...request.messages].reverse().find((m) => m.role === 'user');
    const content = last?.content;
    const text = typeof content === 'string' ? content : JSON.stringify(content ?? '');
    return { text: `${prefix}${text}` };
  };

/** Answers each request with the next reply of the list, then with the last one forever. */
export function replies(...list: Reply[]): Responder {
  let i = 0;
  return () => list[Math.min(i++, list.length - 1)]!;
}

/**
 * The common agent exchange: while the conversation has no tool result yet, ask for the given
 * tool calls; once it has, answer with text built from the tool results.
 */
export function toolThenAnswer(
  calls: (request: StandInRequest) => { name: string; arguments: unknown }[],
  answer: (results: string[]) => string = (results) => `Done: ${results.join(', ')}`,
): Responder {
  return (request) => {
    const results = request.messages.filter((m) => m.role === 'tool');
    if (results.length === 0) return { toolCalls: calls(request) };
    return {
      text: answer(
        results.map((m) => (typeof m.content === 'string' ? m.content : JSON.stringify(m.content))),
      ),
    };
  };
}
