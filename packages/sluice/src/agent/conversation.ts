import type { Api, AssistantMessage, Message, Model } from '@mariozechner/pi-ai';
import { fail } from './options.js';

/** A part of a message: text, or an image as base64 bytes with its mime type (user messages only). */
export type ChatPart = { type: 'text'; text: string } | { type: 'image'; data: string; mimeType: string };

/** A message of a conversation, as a run server keeps it. */
export interface ChatMessage {
  role: 'user' | 'assistant' | 'system';
  content: string | readonly ChatPart[];
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
    if (typeof content === 'string') return;
    if (!Array.isArray(content)) fail(`${field}[${i}].content`, 'a string or a list of parts', content);
    content.forEach((part: unknown, j) => checkPart(`${field}[${i}].content[${j}]`, part, role));
  });
  return value as readonly ChatMessage[];
}

function checkPart(field: string, part: unknown, role: string): void {
  const { type, text, data, mimeType } = (part ?? {}) as Record<string, unknown>;
  if (type === 'text') {
    if (typeof text !== 'string') fail(`${field}.text`, 'a string', text);
    return;
  }
  if (type !== 'image') fail(`${field}.type`, "'text' or 'image'", type);
  if (role !== 'user')
    fail(`${field}.type`, `'text' (images go in user messages, this one is ${role})`, type);
  if (typeof data !== 'string' || data === '') fail(`${field}.data`, 'base64 image bytes', data);
  if (typeof mimeType !== 'string' || !mimeType.startsWith('image/'))
    fail(`${field}.mimeType`, 'an image mime type', mimeType);
}

/** Refuses images for a model that takes text only, rather than let pi-ai swap them for a placeholder. */
function checkModelTakes(field: string, messages: readonly ChatMessage[], model: Model<Api>): void {
  if (model.input.includes('image')) return;
  messages.forEach((m, i) => {
    if (typeof m.content === 'string') return;
    const j = m.content.findIndex((part) => part.type === 'image');
    if (j >= 0)
      throw new TypeError(
        `\`${field}[${i}].content[${j}]\` is an image, and model \`${model.provider}/${model.id}\` takes text only`,
      );
  });
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
  checkModelTakes('history', earlier, model);
  checkModelTakes('prompt', asked, model);
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
  if (m.role !== 'user') return assistantMessage(model, [{ type: 'text', text: textOf(m) }], now);
  if (typeof m.content === 'string') return { role: 'user', content: m.content, timestamp: now };
  const content = m.content.map((part) =>
    part.type === 'text'
      ? { type: 'text' as const, text: part.text }
      : { type: 'image' as const, data: part.data, mimeType: part.mimeType },
  );
  return { role: 'user', content, timestamp: now };
}

/** The text of a message (its text parts, one per line). */
function textOf(m: ChatMessage): string {
  if (typeof m.content === 'string') return m.content;
  return m.content.flatMap((part) => (part.type === 'text' ? [part.text] : [])).join('\n');
}

/**
 * The earlier conversation of a resumed run. Its system texts are left out: they are in the
 * paused run's system prompt already.
 */
export function resumedHistory(history: unknown, model: Model<Api>, now: number): Message[] {
  const earlier = history === undefined ? [] : checkMessages('history', history);
  checkModelTakes('history', earlier, model);
  return earlier.filter((m) => m.role !== 'system').map((m) => loopMessage(m, model, now));
}

function systemText(m: ChatMessage): string[] {
  return m.role === 'system' ? [textOf(m)] : [];
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
