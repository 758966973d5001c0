import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { createAgent, type ChatMessage } from 'sluice';
import { useAgentFixture } from './fixture.js';

const f = useAgentFixture();

// A 1x1 PNG: the bytes a user message carries, and the provider must receive unchanged.
const png = Buffer.from(
  'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg==',
  'base64',
);
const sha256 = createHash('sha256').update(png).digest('hex');
const prompt: ChatMessage[] = [
  {
    role: 'user',
    content: [
      { type: 'text', text: 'what is this?' },
      { type: 'image', data: png.toString('base64'), mimeType: 'image/png' },
    ],
  },
];

describe('images in a prompt', () => {
  it.each(['openai-completions', 'anthropic-messages'] as const)(
    'reach the provider as image content over %s',
    async (api) => {
      const p = await f.provider();
      const agent = createAgent({ model: f.model(p, api), credentials: f.credentials, clock: f.clock });
      const result = await agent.run({ prompt });
      expect(result.text).toBe(`Echo: what is this? [image image/png, ${png.length} bytes]`);
      expect(p.requests[0]!.images).toEqual([{ mimeType: 'image/png', bytes: png.length, sha256 }]);
    },
  );

  it("a model whose `input` is ['text'] refuses them by name, before any request", async () => {
    const p = await f.provider();
    const model = { ...f.model(p), input: ['text' as const] };
    const agent = createAgent({ model, credentials: f.credentials, clock: f.clock });
    expect(agent.modelInput).toEqual(['text']);
    await expect(agent.run({ prompt })).rejects.toThrow(
      /`prompt\[0\]\.content\[1\]` is an image, and model `stand-in\/stand-in-1` takes text only/,
    );
    expect(p.requests).toHaveLength(0);
  });

  it('an object-form model reads images unless told; `input` is checked', async () => {
    const p = await f.provider();
    expect(createAgent({ model: f.model(p), credentials: f.credentials }).modelInput).toEqual([
      'text',
      'image',
    ]);
    for (const input of [[], ['image'], ['text', 'video'], ['text', 'text'], 'text']) {
      expect(() =>
        createAgent({ model: { ...f.model(p), input: input as never }, credentials: f.credentials }),
      ).toThrow(/`model\.input`/);
    }
  });

  it('an image outside a user message, or without its bytes, is refused naming the part', async () => {
    const p = await f.provider();
    const agent = createAgent({ model: f.model(p), credentials: f.credentials, clock: f.clock });
    const image = { type: 'image' as const, data: png.toString('base64'), mimeType: 'image/png' };
    await expect(
      agent.run({
        prompt: [
          { role: 'assistant', content: [image] },
          { role: 'user', content: 'so?' },
        ],
      }),
    ).rejects.toThrow(/prompt\[0\]\.content\[0\]\.type/);
    await expect(
      agent.run({ prompt: [{ role: 'user', content: [{ ...image, data: '' }] }] }),
    ).rejects.toThrow(/prompt\[0\]\.content\[0\]\.data/);
    await expect(
      agent.run({ prompt: [{ role: 'user', content: [{ ...image, mimeType: 'text/plain' }] }] }),
    ).rejects.toThrow(/prompt\[0\]\.content\[0\]\.mimeType/);
    expect(p.requests).toHaveLength(0);
  });
});
