import type { Api, AssistantMessage, Message, Model } from '@mariozechner/pi-ai';
import { fail } from './options.js';

/** A message of a conversation, as a run server keeps it. */
export interface ChatMessage {
  role: 'user' | 'assistant' | 'system';
  content: string;
}

/** What a run sends: its system prompt, the earlier conversation, and the run's new messages. */
export interface Conversation {
  readonly systemPrompt: string;
  /** Context only: not part of the run's messages. */
  readonly history: Message[];
  /** The run's new input, the first of its messages. */
  readonly prompts: Message[];
}

const roles: readonly string[] = ['user', 'assistant', 'system'] satisfies ChatMessage['role'][];

/** Checks a list of messages, naming the bad one by its index (`history[3].role`). */
function checkMessages(field: string, value: unknown): readonly ChatMessage[] {
  if (!Array.isArray(value)) fail(field, 'a list of messages', value);
  value.forEach((m: unknown, i) => {
    if (typeof m !== 'object' || m === null || Array.isArray(m)) fail(`${field}[${i}]`, 'a message', m);
    const { role, content } = m as Record<string, unknown>;
    if (typeof role !== 'string' || !roles.includes(role)) {
      fail(`${field}[${i}].role`, `one of ${roles.join(', ')}`, role);
    }
    if (typeof content !== 'string') fail(`${field}[${i}].content`, 'a string', content);
  });
  return value as readonly ChatMessage[];
}

/**
 * The run's input as the loop takes it. User and assistant messages keep their order; the
 * texts of system messages (history first, then prompt) join the agent's instructions, since
 * the loop has one system prompt and the providers take none between messages. An assistant
 * message is rebuilt as an answer of the agent's own model, with no usage of its own, so a
 * run's usage counts only what this run spent.
 */
export function toConversation(
  input: { instructions: string | undefined; prompt: unknown; history: unknown },
  model: Model<Api>,
  now: number,
): Conversation {
  const { prompt, history } = input;
  if (typeof prompt !== 'string' && !Array.isArray(prompt)) {
    fail('prompt', 'a string or a list of messages', prompt);
  }
  const earlier = history === undefined ? [] : checkMessages('history', history);
  const asked: readonly ChatMessage[] =
    typeof prompt === 'string' ? [{ role: 'user', content: prompt }] : checkMessages('prompt', prompt);
  if (!asked.some((m) => m.role !== 'system')) {
    fail('prompt', 'a list with at least one user or assistant message', prompt);
  }
  const system = [input.instructions ?? '', ...[...earlier, ...asked].flatMap(systemText)];
  const toMessage = (m: ChatMessage) => loopMessage(m, model, now);
  return {
    systemPrompt: system.filter((text) => text !== '').join('\n\n'),
    history: earlier.filter((m) => m.role !== 'system').map(toMessage),
    prompts: asked.filter((m) => m.role !== 'system').map(toMessage),
  };
}

function loopMessage(m: ChatMessage, model: Model<Api>, now: number): Message {
  return m.role === 'user'
    ? { role: 'user', content: m.content, timestamp: now }
    : assistantMessage(model, [{ type: 'text', text: m.content }], now);
}

/**
 * The earlier conversation of a resumed run. Its system texts are left out: they are in the
 * paused run's system prompt already.
 */
export function resumedHistory(history: unknown, model: Model<Api>, now: number): Message[] {
  const earlier = history === undefined ? [] : checkMessages('history', history);
  return earlier.filter((m) => m.role !== 'system').map((m) => loopMessage(m, model, now));
}

function systemText(m: ChatMessage): string[] {
  return m.role === 'system' ? [m.content] : [];
}

/**
 * An assistant message of the agent's own model with no usage of its own: an earlier answer
 * given back as history, or the base of a provider request that failed before it answered.
 */
export function assistantMessage(
  model: Model<Api>,
  content: AssistantMessage['content'],
  timestamp: number,
): AssistantMessage {
  return {
    role: 'assistant',
    content,
    api: model.api,
    provider: model.provider,
    model: model.id,
    usage: {
      input: 0,
      output: 0,
      cacheRead: 0,
      cacheWrite: 0,
      totalTokens: 0,
      cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
    },
    stopReason: 'stop',
    timestamp,
  };
}
