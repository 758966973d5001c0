/**
 * Model specs and credentials, turned into what pi-ai takes. With src/agent (where the provider
 * request lives), the only code that sees pi's types: none of them leaves the two.
 */
import { getEnvApiKey, getModel, type Api, type Model } from '@mariozechner/pi-ai';
import { modelDefaults } from './defaults.js';

/** A model: `'provider/model-id'` from the catalog, or an endpoint of your own. */
export type ModelSpec =
  | string
  | {
      api: 'openai-completions' | 'openai-responses' | 'anthropic-messages';
      provider: string;
      id: string;
      /** Where to send requests: a gateway, a self-hosted model, the local stand-in. */
      baseUrl?: string;
      /** @default 128000 */
      contextWindow?: number;
      /** @default 4096 */
      maxTokens?: number;
      /** Prices per million tokens, for usage cost. @default all 0 */
      cost?: { input: number; output: number; cacheRead?: number; cacheWrite?: number };
      /** What the model reads: `['text']` for one that takes no images. @default ['text', 'image'] */
      input?: ('text' | 'image')[];
    };

/** One API key; a list is tried in order (credential fallback). */
export interface Credential {
  apiKey: string;
}

const defaultBaseUrls: Record<string, string> = {
  'openai-completions': 'https://api.openai.com/v1',
  'openai-responses': 'https://api.openai.com/v1',
  'anthropic-messages': 'https://api.anthropic.com',
};

/** Turns a model spec into pi-ai's model object. Throws TypeError naming what is wrong. */
export function resolveModel(spec: ModelSpec): Model<Api> {
  if (typeof spec === 'string') {
    const slash = spec.indexOf('/');
    if (slash <= 0 || slash === spec.length - 1) {
      throw new TypeError(`Expected \`model\` to be 'provider/model-id', got \`${spec}\``);
    }
    const provider = spec.slice(0, slash);
    const id = spec.slice(slash + 1);
    const model = (getModel as (p: string, m: string) => Model<Api> | undefined)(provider, id);
    if (!model)
      throw new TypeError(
        `Unknown model \`${spec}\`: not in the catalog (or use the object form with baseUrl)`,
      );
    return model;
  }
  if (typeof spec !== 'object' || spec === null)
    throw new TypeError(`Expected \`model\` to be a string or an object`);
  for (const key of ['api', 'provider', 'id'] as const) {
    if (typeof spec[key] !== 'string' || spec[key] === '') {
      throw new TypeError(`Expected \`model.${key}\` to be a non-empty string, got \`${String(spec[key])}\``);
    }
  }
  if (!(spec.api in defaultBaseUrls)) {
    throw new TypeError(
      `Expected \`model.api\` to be one of ${Object.keys(defaultBaseUrls).join(', ')}, got \`${spec.api}\``,
    );
  }
  return {
    id: spec.id,
    name: spec.id,
    api: spec.api,
    provider: spec.provider,
    baseUrl: spec.baseUrl ?? defaultBaseUrls[spec.api]!,
    reasoning: false,
    input: inputKinds(spec.input),
    cost: {
      input: spec.cost?.input ?? 0,
      output: spec.cost?.output ?? 0,
      cacheRead: spec.cost?.cacheRead ?? 0,
      cacheWrite: spec.cost?.cacheWrite ?? 0,
    },
    contextWindow: spec.contextWindow ?? modelDefaults.contextWindow,
    maxTokens: spec.maxTokens ?? modelDefaults.maxTokens,
  };
}

const kinds: readonly string[] = ['text', 'image'];

function inputKinds(given: unknown): ('text' | 'image')[] {
  if (given === undefined) return ['text', 'image'];
  if (
    !Array.isArray(given) ||
    !given.includes('text') ||
    given.some((kind) => !kinds.includes(kind as string)) ||
    new Set(given).size !== given.length
  ) {
    throw new TypeError(
      `Expected \`model.input\` to be ['text'] or ['text', 'image'], got \`${JSON.stringify(given) ?? String(given)}\``,
    );
  }
  return [...(given as ('text' | 'image')[])];
}

/** The credentials to try, in order: the given ones, else the provider's usual environment variable. */
export function resolveCredentials(
  model: Model<Api>,
  credentials: Credential | Credential[] | undefined,
): Credential[] {
  if (credentials === undefined) {
    const key = getEnvApiKey(model.provider);
    return key ? [{ apiKey: key }] : [];
  }
  const list = Array.isArray(credentials) ? credentials : [credentials];
  for (const [i, c] of list.entries()) {
    if (typeof c?.apiKey !== 'string' || c.apiKey === '') {
      throw new TypeError(
        `Expected \`credentials${Array.isArray(credentials) ? `[${i}]` : ''}.apiKey\` to be a non-empty string`,
      );
    }
  }
  return list;
}
