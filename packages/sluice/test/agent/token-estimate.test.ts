// The input-token estimate, measured against a real tokenizer on requests shaped like an
// agent's: the figures stated in src/agent/token-estimate.ts come from this file.
import { readFileSync } from 'node:fs';
import type { Context, Message } from '@mariozechner/pi-ai';
import { countTokens } from 'gpt-tokenizer/encoding/o200k_base';
import { describe, expect, it } from 'vitest';
import { resolveModel } from '../../src/models/model.js';
import { estimateInputTokens, estimateOutputTokens, requestTokens } from '../../src/agent/token-estimate.js';

const root = new URL('../../../../', import.meta.url);
const file = (path: string) => readFileSync(new URL(path, root), 'utf8');
const at = 1_700_000_000_000;
const user = (content: string): Message => ({ role: 'user', content, timestamp: at });
const model = resolveModel({ api: 'openai-completions', provider: 'p', id: 'm', baseUrl: 'http://x' });
const assistant = (content: Extract<Message, { role: 'assistant' }>['content']): Message => ({
  role: 'assistant',
  content,
  api: 'openai-completions',
  provider: 'p',
  model: 'm',
  usage: {
    input: 0,
    output: 0,
    cacheRead: 0,
    cacheWrite: 0,
    totalTokens: 0,
    cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 },
  },
  stopReason: 'toolUse',
  timestamp: at,
});

const tools: Context['tools'] = [
  {
    name: 'search_orders',
    description: 'Finds the orders of a customer, newest first. Use it before answering about an order.',
    parameters: {
      type: 'object',
      properties: {
        customerId: { type: 'string', description: 'The customer id, as cus_...' },
        status: { type: 'string', enum: ['open', 'shipped', 'returned'] },
        limit: { type: 'integer', minimum: 1, maximum: 50 },
      },
      required: ['customerId'],
    } as never,
  },
  {
    name: 'refund',
    description: 'Refunds an order in full or in part. Needs a person to approve amounts over 100 EUR.',
    parameters: {
      type: 'object',
      properties: {
        orderId: { type: 'string' },
        amountCents: { type: 'integer' },
        reason: { type: 'string' },
      },
      required: ['orderId', 'amountCents'],
    } as never,
  },
];
const orders = JSON.stringify(
  Array.from({ length: 12 }, (_, i) => ({
    id: `ord_${1000 + i}`,
    status: ['open', 'shipped', 'returned'][i % 3],
    placedAt: new Date(at - i * 86_400_000).toISOString(),
    items: [
      { sku: `SKU-${i * 7}`, name: `Item number ${i}`, quantity: 1 + (i % 3), priceCents: 1999 + i * 250 },
    ],
    shipping: {
      carrier: 'DHL',
      tracking: `JD0146000${i}9988`,
      address: { city: 'Berlin', postcode: '10115' },
    },
  })),
);

/** Requests an agent sends: prose, code, JSON tools and results, and a short chat. */
const requests: Record<string, Context> = {
  'support agent with tools and a JSON result': {
    systemPrompt: file('docs/agents.md').slice(0, 2_000),
    tools,
    messages: [
      user('Where is my last order, and can I get a refund for the shipping? My id is cus_8812.'),
      assistant([
        { type: 'toolCall', id: 'call_1', name: 'search_orders', arguments: { customerId: 'cus_8812' } },
      ]),
      {
        role: 'toolResult',
        toolCallId: 'call_1',
        toolName: 'search_orders',
        content: [{ type: 'text', text: orders }],
        isError: false,
        timestamp: at,
      },
    ],
  },
  'code review of a TypeScript file': {
    systemPrompt: 'You review TypeScript for correctness and clarity. Answer with a short list.',
    messages: [user(`Review this file:\n\n${file('packages/sluice/src/concurrency/allocate.ts')}`)],
  },
  'summary of a long document': {
    systemPrompt: 'You compress conversations.',
    messages: [user(file('docs/concurrency.md'))],
  },
  'a JSON document as a tool result': {
    messages: [
      user('What does the server depend on?'),
      assistant([
        { type: 'toolCall', id: 'c', name: 'read_file', arguments: { path: 'packages/server/package.json' } },
      ]),
      {
        role: 'toolResult',
        toolCallId: 'c',
        toolName: 'read_file',
        content: [{ type: 'text', text: file('packages/server/package.json') }],
        isError: false,
        timestamp: at,
      },
    ],
  },
  'a short chat': {
    systemPrompt: 'You are a helpful assistant.',
    messages: [user('What is the capital of France?')],
  },
};

/**
 * The tokenizer's count of what the request sends: every text and JSON piece encoded exactly,
 * plus OpenAI's documented chat framing (3 tokens per message, 3 to prime the answer).
 */
function counted(context: Context): number {
  let tokens = 3;
  const pieces: string[] = [];
  if (context.systemPrompt) pieces.push(context.systemPrompt);
  for (const m of context.messages) {
    if (typeof m.content === 'string') pieces.push(m.content);
    else {
      for (const block of m.content) {
        if (block.type === 'text') pieces.push(block.text);
        else if (block.type === 'toolCall') pieces.push(block.name, JSON.stringify(block.arguments));
      }
    }
  }
  for (const tool of context.tools ?? []) pieces.push(JSON.stringify(tool));
  for (const piece of pieces) tokens += countTokens(piece);
  return tokens + 3 * (context.messages.length + (context.systemPrompt ? 1 : 0));
}

describe('estimateInputTokens against gpt-tokenizer (o200k_base)', () => {
  const ratios = Object.entries(requests).map(([name, context]) => {
    const estimate = estimateInputTokens(context);
    const actual = counted(context);
    return { name, estimate, actual, ratio: estimate / actual };
  });

  it.each(ratios)('$name: estimate $estimate for $actual tokens', ({ ratio }) => {
    // The range stated in token-estimate.ts, with a little room for the docs to change.
    expect(ratio).toBeGreaterThanOrEqual(0.95);
    expect(ratio).toBeLessThanOrEqual(1.3);
  });

  it('overestimates the whole set a little, never by much', () => {
    const estimate = ratios.reduce((sum, r) => sum + r.estimate, 0);
    const actual = ratios.reduce((sum, r) => sum + r.actual, 0);
    expect(estimate / actual).toBeGreaterThanOrEqual(1);
    expect(estimate / actual).toBeLessThanOrEqual(1.2);
  });
});

describe('estimateInputTokens on odd input', () => {
  it('counts images at a fixed figure and survives arguments JSON cannot hold', () => {
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    const context: Context = {
      messages: [
        { role: 'user', content: [{ type: 'image', data: 'AAAA', mimeType: 'image/png' }], timestamp: at },
        assistant([{ type: 'toolCall', id: 'c', name: 'x', arguments: cyclic }]),
      ],
    };
    expect(estimateInputTokens(context)).toBe(Math.ceil(1 / 2.75) + 2 * 4 + 1_000 + 3);
  });

  it('is the framing alone for an empty request', () => {
    expect(estimateInputTokens({ messages: [] })).toBe(3);
  });
});

describe('estimateOutputTokens', () => {
  it.each([
    ['the model cap pi-ai sends', undefined, undefined, 4096],
    ['the stream option cap', { maxTokens: 300 }, undefined, 300],
    ['concurrency.outputTokens, below the cap', undefined, 800, 800],
    ['concurrency.outputTokens, never above the cap', { maxTokens: 300 }, 800, 300],
    ['concurrency.outputTokens of 0', undefined, 0, 0],
  ])('%s', (_, streamOptions, outputTokens, expected) => {
    expect(estimateOutputTokens(model, streamOptions, outputTokens)).toBe(expected);
  });

  it('caps a large model at the 32,000 pi-ai sends', () => {
    const big = resolveModel({
      api: 'anthropic-messages',
      provider: 'p',
      id: 'm',
      baseUrl: 'http://x',
      maxTokens: 64_000,
    });
    expect(requestTokens({ messages: [] }, big, undefined, undefined)).toEqual({ input: 3, output: 32_000 });
  });
});
