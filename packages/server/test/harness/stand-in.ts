import { startProviderStandIn, type ProviderStandIn } from '@sluice/testkit';
import { afterThisTest } from './registry.js';

/** The text of the last user message of a stand-in request (its text parts, when it has parts). */
export const lastUserText = (r: { messages: readonly { role: string; content?: unknown }[] }) => {
  const content = [...r.messages].reverse().find((m) => m.role === 'user')?.content;
  if (Array.isArray(content)) return content.map((p: { text?: unknown }) => String(p?.text ?? '')).join('');
  return String(content ?? '');
};

/** Dollars per million tokens, each way. */
export interface Price {
  input: number;
  output: number;
}

/** The stand-in as a model for `createAgent`, priced so usage has a cost ($0.001 per million by default). */
export const standInModel = (provider: ProviderStandIn, cost: Price = { input: 0.001, output: 0.001 }) => ({
  api: 'openai-completions' as const,
  provider: 'stand-in',
  id: 'm',
  baseUrl: provider.url,
  cost,
});

/** Registers a stand-in's close after the test. */
export function ownStandIn(provider: ProviderStandIn): ProviderStandIn {
  afterThisTest(
    // A test may have closed it itself (to see a provider outage, say).
    () => provider.close().catch(unlessClosedAlready),
    `the stand-in at ${provider.url}`,
  );
  return provider;
}

function unlessClosedAlready(error: unknown): void {
  if ((error as { code?: string }).code !== 'ERR_SERVER_NOT_RUNNING') throw error;
}

/** A stand-in where "stall" in the prompt hangs, "fail" is a provider 400, else "done <prompt>". */
export async function startStandIn(): Promise<ProviderStandIn> {
  return ownStandIn(
    await startProviderStandIn({
      reply: (r) => {
        const last = lastUserText(r);
        if (last.includes('stall')) return { stall: true };
        if (last.includes('fail')) return { status: 400, message: 'the model refused' };
        return { text: `done ${last}`, usage: { input: 10, output: 10 } };
      },
    }),
  );
}
