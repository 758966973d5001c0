/** What a model spec of your own gets when it leaves these out (see `agentDefaults.model`). */
export const modelDefaults = Object.freeze({ contextWindow: 128_000, maxTokens: 4096 });
