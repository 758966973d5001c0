import type { SqlClient } from '@sluice/postgres/database';
import type { ChatMessage } from 'sluice';
import { ConcurrencyError, RepairLimitError } from 'sluice';
import { FileGoneError, hasImages, resolveMessages, type StoredMessage } from '../media/parts.js';
import { cleanText } from './json.js';

/** What goes into an agent run from a stored run, and what comes out of it into the store. */

/**
 * The run's answer: the text of every assistant turn, in order, as its stream showed it (a turn
 * that says something before it calls a tool is part of what the user was told). The run's
 * messages begin with its prompt (system messages aside, which go to the system prompt): those
 * are skipped, assistant messages a client sent included.
 */
export function answerOf(input: unknown, runMessages: readonly unknown[]): string {
  const prompt = chatMessages(input);
  const asked = typeof prompt === 'string' ? 1 : prompt.filter((m) => m.role !== 'system').length;
  let text = '';
  for (const message of runMessages.slice(asked) as { role?: unknown; content?: unknown }[]) {
    if (message.role !== 'assistant') continue;
    if (typeof message.content === 'string') text += message.content;
    else if (Array.isArray(message.content))
      for (const block of message.content as { type?: unknown; text?: unknown }[])
        if (block.type === 'text' && typeof block.text === 'string') text += block.text;
  }
  return text;
}

type StoredContent = string | { type: string; text?: string }[];

const textOf = (content: StoredContent): string =>
  typeof content === 'string'
    ? content
    : content.flatMap((b) => (typeof b.text === 'string' ? [b.text] : [])).join('\n');

export const toChatMessage = (m: { role: ChatMessage['role']; content: unknown }): ChatMessage => ({
  role: m.role,
  content: textOf(m.content as StoredContent),
});

/** A stored input as the agent's prompt: the text, or the messages in order. */
export function chatMessages(input: unknown): string | ChatMessage[] {
  if (typeof input === 'string') return input;
  if (Array.isArray(input))
    return (input as { role: ChatMessage['role']; content: unknown }[]).map(toChatMessage);
  return JSON.stringify(input);
}

/** A stored input as the agent's prompt, with the bytes of its images read (see media/parts.ts). */
export async function promptOf(
  db: SqlClient,
  tenant: string,
  input: unknown,
): Promise<string | ChatMessage[]> {
  if (!hasImages(input)) return chatMessages(input);
  return resolveMessages(db, tenant, input as StoredMessage[], 'fail');
}

/** A thread's earlier messages as the agent's history; an image deleted since is said to be. */
export async function historyMessages(
  db: SqlClient,
  tenant: string,
  history: { role: ChatMessage['role']; content: unknown }[],
): Promise<ChatMessage[]> {
  if (!hasImages(history)) return history.map(toChatMessage);
  return resolveMessages(db, tenant, history as StoredMessage[], 'note');
}

/**
 * What a client sees of a failure. Sluice's own errors say what happened in our words; other
 * errors (a provider's body, a network error naming an internal host) stay in the server log.
 */
export function publicMessage(error: unknown, runId: string): string {
  if (
    error instanceof ConcurrencyError ||
    error instanceof RepairLimitError ||
    error instanceof FileGoneError
  )
    return cleanText(error.message).slice(0, 2_000);
  const name = error instanceof Error ? error.name : typeof error;
  return `The agent failed (${name}); the server log has the details under run ${runId}`;
}
