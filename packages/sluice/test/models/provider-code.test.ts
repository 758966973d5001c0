import { describe, expect, it } from 'vitest';
import { loadProviderCode } from '../../src/index.js';

describe('loadProviderCode', () => {
  it("loads each of pi-ai's own provider modules once, and leaves other APIs to pi-ai", async () => {
    expect(
      await loadProviderCode([
        'openai-completions',
        'anthropic-messages',
        'openai-completions',
        // Bedrock's module is loaded by pi-ai itself; a custom API has no module of pi-ai's.
        'bedrock-converse-stream',
        'my-own-api',
        '__proto__',
      ]),
    ).toEqual({ loaded: ['openai-completions', 'anthropic-messages'], failed: [] });
    expect(await loadProviderCode([])).toEqual({ loaded: [], failed: [] });
  });
});
