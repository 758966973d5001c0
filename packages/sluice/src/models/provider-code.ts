import type { Api } from '@mariozechner/pi-ai';

/**
 * pi-ai loads each API's provider module (and the SDK behind it) the first time a request of
 * that API is made, so the first model requests after a start wait for it: on an idle machine
 * about 70 ms for `openai-completions`, 1.25 s for Mistral's, more on a busy one. These import
 * the same modules ahead of time; pi-ai's own import then finds them loaded.
 */
const providerModules: Partial<Record<Api, () => Promise<unknown>>> = {
  'openai-completions': () => import('@mariozechner/pi-ai/openai-completions'),
  'openai-responses': () => import('@mariozechner/pi-ai/openai-responses'),
  'azure-openai-responses': () => import('@mariozechner/pi-ai/azure-openai-responses'),
  'openai-codex-responses': () => import('@mariozechner/pi-ai/openai-codex-responses'),
  'anthropic-messages': () => import('@mariozechner/pi-ai/anthropic'),
  'google-generative-ai': () => import('@mariozechner/pi-ai/google'),
  'google-vertex': () => import('@mariozechner/pi-ai/google-vertex'),
  'mistral-conversations': () => import('@mariozechner/pi-ai/mistral'),
};

/** What {@link loadProviderCode} did: the APIs whose module it loaded, and those whose module failed to load. */
export interface ProviderCodeLoaded {
  loaded: string[];
  failed: { api: string; error: unknown }[];
}

/**
 * Loads the provider code of these model APIs now rather than at their first request (a server
 * does it before it listens). An API pi-ai has no module of its own for (a custom one, or
 * Bedrock's, loaded by pi-ai itself) is left as it is, and so is one whose module fails to load
 * (an SDK missing from the install, say): it is answered in `failed`, and its first request
 * fails as it would have without this, with pi-ai's error.
 */
export async function loadProviderCode(apis: Iterable<string>): Promise<ProviderCodeLoaded> {
  const known = [...new Set(apis)].filter((api): api is Api => Object.hasOwn(providerModules, api));
  const settled = await Promise.allSettled(known.map((api) => providerModules[api]!()));
  return {
    loaded: known.filter((_, i) => settled[i]!.status === 'fulfilled'),
    failed: settled.flatMap((outcome, i) =>
      outcome.status === 'rejected' ? [{ api: known[i]!, error: outcome.reason as unknown }] : [],
    ),
  };
}
