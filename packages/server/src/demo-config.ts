import { createAgent, createConcurrencyLimiter, tool } from 'sluice';
import type * as Testkit from '@sluice/testkit';
import { defineConfig, type SluiceConfig } from './config.js';

/**
 * The built-in config of `sluice serve` when there is no `sluice.config.*`: a writer agent
 * that asks a researcher agent through a tool, on one limiter, against the local provider
 * stand-in started in this process (or OpenAI, when OPENAI_API_KEY is set).
 */
export async function demoConfig(): Promise<SluiceConfig> {
  const real = process.env.OPENAI_API_KEY;
  const provider = real ? undefined : await startStandIn();
  const model = provider
    ? { api: 'openai-completions' as const, provider: 'stand-in', id: 'demo-model', baseUrl: provider.url }
    : 'openai/gpt-4o-mini';
  const credentials = provider ? { apiKey: 'demo' } : undefined;
  const limiter = createConcurrencyLimiter({ name: 'provider', maxConcurrent: 8 });
  const researcher = createAgent({
    model,
    credentials,
    instructions: 'You are a researcher. Give one fact.',
  });
  const writer = createAgent({
    model,
    credentials,
    instructions: 'You are a writer. Ask the researcher, then write a short report.',
    concurrency: { limiter },
    tools: [
      tool<{ topic: string }>({
        name: 'research',
        description: 'Ask the researcher about a topic',
        parameters: { type: 'object', properties: { topic: { type: 'string' } }, required: ['topic'] },
        execute: async ({ topic }) => (await researcher.run({ prompt: topic })).text,
      }),
    ],
  });
  return defineConfig({ agents: { writer, researcher }, close: () => provider?.close() });
}

/** The local provider stand-in, scripted for the two demo agents. */
async function startStandIn(): Promise<Testkit.ProviderStandIn> {
  const { startProviderStandIn } = await importTestkit();
  return startProviderStandIn({
    latencyMs: () => 100 + Math.random() * 200,
    reply: (r) => {
      const system = String(r.messages.find((m) => m.role === 'system')?.content ?? '');
      const question = [...r.messages].reverse().find((m) => m.role === 'user')?.content;
      if (system.startsWith('You are a researcher')) return { text: `A fact about ${String(question)}.` };
      const facts = r.messages.filter((m) => m.role === 'tool');
      if (facts.length === 0)
        return { toolCalls: [{ name: 'research', arguments: { topic: String(question) } }] };
      return { text: `Report: ${facts.map((f) => String(f.content)).join(' ')}` };
    },
  });
}

/**
 * @sluice/testkit is an optional dependency, loaded only here: a production install may omit
 * it (`npm install --omit=optional`), and then only this demo, without OPENAI_API_KEY, needs it.
 */
async function importTestkit(): Promise<typeof Testkit> {
  try {
    return await import('@sluice/testkit');
  } catch (error) {
    const missing =
      (error as { code?: unknown }).code === 'ERR_MODULE_NOT_FOUND' &&
      String((error as Error).message).includes("'@sluice/testkit'");
    if (!missing) throw error;
    throw new Error(
      'The built-in demo (served when there is no sluice.config.{ts,mjs,js}) needs OPENAI_API_KEY ' +
        'or the local provider stand-in from @sluice/testkit, which is not installed. ' +
        'Run `npm install @sluice/testkit`, set OPENAI_API_KEY, or pass --config FILE.',
      { cause: error },
    );
  }
}
