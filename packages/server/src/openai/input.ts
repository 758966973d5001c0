import { HttpError, badRequest, shown } from '../http/errors.js';
import { imagePart, type StoredMessage, type StoredPart } from '../media/parts.js';

/**
 * What the OpenAI endpoints are sent, turned into a run's messages. Text and images are
 * understood: a file, an audio part or a tool call item is refused naming where it is, never
 * dropped quietly.
 */

export type RunMessage = StoredMessage;

const roles: Record<string, RunMessage['role']> = {
  user: 'user',
  assistant: 'assistant',
  system: 'system',
  developer: 'system',
};

/** The agent a `model` names: `agent:NAME` (or the bare name); 404 model_not_found otherwise. */
export function agentOfModel(model: string, exists: (name: string) => boolean): string {
  const name = model.startsWith('agent:') ? model.slice('agent:'.length) : model;
  if (!exists(name)) {
    throw new HttpError(
      404,
      'model_not_found',
      `No model \`${shown(model)}\`: name an agent of this server as \`agent:NAME\``,
      { field: 'model' },
    );
  }
  return name;
}

type Part = { type?: unknown; text?: unknown; file_id?: unknown; image_url?: unknown };

/**
 * A message's content as a run's: text parts of the given kinds, and images as the endpoint
 * sends them (`input_image` with `file_id` or `image_url` on /responses, `image_url` with
 * `{ url }` on /chat/completions), kept by reference or data: URL (media/parts.ts).
 */
function contentParts(
  content: unknown,
  where: string,
  kinds: string[],
  image: 'input_image' | 'image_url',
): RunMessage['content'] {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content))
    throw badRequest(`Expected \`${where}\` to be a string or a list of parts`, { field: where });
  return content.map((part: Part, i): StoredPart => {
    const type = String(part?.type);
    if (type === image) {
      if (image === 'input_image') return imagePart(part, `${where}.${i}`);
      const url = (part.image_url as { url?: unknown } | undefined)?.url;
      return imagePart({ image_url: url }, `${where}.${i}`, `${where}.${i}.image_url.url`);
    }
    if (kinds.includes(type) && (typeof part.text !== 'string' || part.text === '')) {
      throw badRequest(`Expected \`${where}.${i}.text\` to be a non-empty string`, {
        field: `${where}.${i}.text`,
      });
    }
    if (!kinds.includes(type)) {
      throw badRequest(
        `\`${where}.${i}\` is a \`${shown(part?.type)}\` part; only ${[...kinds, image].join(', ')} parts are understood`,
        { field: `${where}.${i}.type` },
      );
    }
    return { type: 'text' as const, text: part.text as string };
  });
}

/** A Responses `input` (a string, or message items) as a run's input. */
export function responsesInput(input: unknown): string | RunMessage[] {
  if (typeof input === 'string') return input;
  return (input as { type?: unknown; role?: unknown; content?: unknown }[]).map((item, i) => {
    if (item.type !== undefined && item.type !== 'message') {
      throw badRequest(
        `\`input.${i}\` is a \`${shown(item.type)}\` item; only message items are understood`,
        {
          field: `input.${i}.type`,
        },
      );
    }
    const role = roles[String(item.role)];
    if (!role)
      throw badRequest(`Unknown role \`${shown(item.role)}\` in \`input.${i}\``, {
        field: `input.${i}.role`,
      });
    return {
      role,
      content: contentParts(item.content, `input.${i}.content`, ['input_text', 'output_text'], 'input_image'),
    };
  });
}

/** Chat Completions `messages` as a run's input. */
export function chatInput(messages: { role?: unknown; content?: unknown }[]): RunMessage[] {
  return messages.map((m, i) => {
    const role = roles[String(m.role)];
    if (!role)
      throw badRequest(
        `Role \`${shown(m.role)}\` of \`messages.${i}\` is not understood; use user, assistant, system or developer`,
        {
          field: `messages.${i}.role`,
        },
      );
    return { role, content: contentParts(m.content, `messages.${i}.content`, ['text'], 'image_url') };
  });
}
