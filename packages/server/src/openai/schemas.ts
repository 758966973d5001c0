import { metadataSchema, storableText } from '../http/schemas.js';

/**
 * The bodies the OpenAI endpoints accept. Fields the official client may send that change
 * nothing here (`store`, `temperature`...) are accepted and ignored; any other field is refused,
 * naming it, rather than silently not doing what the caller asked.
 */

const ignored = {
  store: { type: 'boolean' },
  user: { type: 'string', maxLength: 256 },
  safety_identifier: { type: 'string', maxLength: 256 },
  temperature: { type: ['number', 'null'] },
  top_p: { type: ['number', 'null'] },
  parallel_tool_calls: { type: ['boolean', 'null'] },
} as const;

/** The runs API's metadata bounds, with string values only, as the OpenAI API has them. */
const openAiMetadata = {
  ...metadataSchema,
  additionalProperties: { type: 'string', maxLength: 512, pattern: storableText },
  description: 'Up to 16 keys of at most 64 characters, with string values of at most 512 characters.',
} as const;

const serviceTier = { type: 'string', enum: ['auto', 'default', 'flex', 'priority', 'scale'] } as const;

const textPart = {
  type: 'object',
  required: ['type'],
  properties: { type: { type: 'string', maxLength: 100 }, text: { type: 'string', pattern: storableText } },
} as const;

const partsOrText = {
  anyOf: [
    { type: 'string', minLength: 1, pattern: storableText },
    { type: 'array', minItems: 1, maxItems: 100_000, items: textPart },
  ],
} as const;

export const createResponseBody = {
  type: 'object',
  required: ['model', 'input'],
  additionalProperties: false,
  properties: {
    model: { type: 'string', minLength: 1, maxLength: 200, description: '`agent:NAME`' },
    input: {
      anyOf: [
        { type: 'string', minLength: 1, pattern: storableText },
        {
          type: 'array',
          minItems: 1,
          maxItems: 100_000,
          items: {
            type: 'object',
            required: ['role', 'content'],
            properties: {
              type: { type: 'string', maxLength: 100 },
              role: { type: 'string', maxLength: 100 },
              content: partsOrText,
            },
          },
        },
      ],
    },
    instructions: { type: ['string', 'null'], maxLength: 1_000_000, pattern: storableText },
    metadata: { ...openAiMetadata, type: ['object', 'null'] },
    background: { type: ['boolean', 'null'] },
    service_tier: { ...serviceTier, type: ['string', 'null'], enum: [...serviceTier.enum, null] },
    stream: { type: ['boolean', 'null'] },
    previous_response_id: { type: ['string', 'null'], maxLength: 200 },
    ...ignored,
  },
} as const;

export const createChatBody = {
  type: 'object',
  required: ['model', 'messages'],
  additionalProperties: false,
  properties: {
    model: { type: 'string', minLength: 1, maxLength: 200, description: '`agent:NAME`' },
    messages: {
      type: 'array',
      minItems: 1,
      maxItems: 100_000,
      items: {
        type: 'object',
        required: ['role', 'content'],
        properties: {
          role: { type: 'string', maxLength: 100 },
          content: partsOrText,
          name: { type: 'string' },
        },
      },
    },
    stream: { type: ['boolean', 'null'] },
    stream_options: {
      type: ['object', 'null'],
      additionalProperties: false,
      properties: { include_usage: { type: 'boolean' }, include_obfuscation: { type: 'boolean' } },
    },
    service_tier: { ...serviceTier, type: ['string', 'null'], enum: [...serviceTier.enum, null] },
    metadata: { ...openAiMetadata, type: ['object', 'null'] },
    ...ignored,
  },
} as const;

export const responseParams = {
  type: 'object',
  required: ['id'],
  properties: { id: { type: 'string', maxLength: 500 } },
} as const;
