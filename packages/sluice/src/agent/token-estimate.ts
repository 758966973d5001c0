import type { Api, Context, Model, SimpleStreamOptions } from '@mariozechner/pi-ai';
import type { TokenCounts } from '../concurrency/capacity-types.js';

/**
 * The tokens a provider request is expected to use, for the limiter's token budgets: its input
 * estimated from what it sends, its output from its output-token cap (or the caller's
 * `concurrency.outputTokens`). The limiter settles the grant to the response's usage, so the
 * estimate only has to be close, and is better a little high (a refund) than low (a 429).
 *
 * The input is counted from characters, not with a tokenizer: no provider's tokenizer runs here
 * for every model (Claude's is not published), a BPE table costs megabytes and time at start,
 * and the error below is small next to what settling corrects. Measured against gpt-tokenizer
 * 4.0.0 (o200k_base, GPT-4o's encoding) on the five requests of
 * `test/agent/token-estimate.test.ts` (a support agent with JSON tool schemas and a JSON tool
 * result, a TypeScript file to review, a long Markdown document, a pretty-printed JSON file, a
 * short chat): the estimate is 1.02 to 1.19 times the tokenizer's count per request, 1.10 times
 * over the set (7,982 for 7,282 tokens); it was never below the count. Claude's counts are
 * not measured here, since its current tokenizer is not published.
 */

/** Characters per token of prose and code (measured: 4.1 for this repository's docs and code). */
const charsPerTextToken = 4;
/** Characters per token of JSON (tool schemas, arguments, results): measured 2.9, taken lower. */
const charsPerJsonToken = 2.75;
/** A message's framing in the chat formats (role, separators), as OpenAI documents it, rounded up. */
const tokensPerMessage = 4;
/** What a request's framing and the answer's priming cost on top of its messages. */
const tokensPerRequest = 3;
/** An image, whatever its size: providers charge from about 85 to about 1,600 tokens. */
const tokensPerImage = 1_000;

/** A rough input token count of a request: its system prompt, messages and tool definitions. */
export function estimateInputTokens(context: Context): number {
  const count = { text: 0, json: 0, images: 0 };
  const addText = (text: string) => {
    if (looksLikeJson(text)) count.json += text.length;
    else count.text += text.length;
  };
  if (context.systemPrompt) addText(context.systemPrompt);
  for (const message of context.messages) {
    if (typeof message.content === 'string') {
      addText(message.content);
      continue;
    }
    for (const block of message.content) {
      if (block.type === 'text') addText(block.text);
      else if (block.type === 'thinking') count.text += block.thinking.length;
      else if (block.type === 'toolCall') count.json += block.name.length + jsonLength(block.arguments);
      else count.images++;
    }
  }
  for (const tool of context.tools ?? []) {
    count.json += jsonLength({ name: tool.name, description: tool.description, parameters: tool.parameters });
  }
  const messages = context.messages.length + (context.systemPrompt ? 1 : 0);
  return (
    Math.ceil(count.text / charsPerTextToken + count.json / charsPerJsonToken) +
    messages * tokensPerMessage +
    count.images * tokensPerImage +
    tokensPerRequest
  );
}

/**
 * The output tokens to charge: `outputTokens` when the caller gave it (a typical answer, so a
 * budget is not held for a cap that is rarely reached), never more than the request's cap; else
 * the cap pi-ai sends, which is the stream option or the model's own, at most 32,000.
 */
export function estimateOutputTokens(
  model: Model<Api>,
  streamOptions: SimpleStreamOptions | undefined,
  outputTokens: number | undefined,
): number {
  const cap = streamOptions?.maxTokens ?? (model.maxTokens > 0 ? Math.min(model.maxTokens, 32_000) : 0);
  return outputTokens === undefined ? cap : cap > 0 ? Math.min(outputTokens, cap) : outputTokens;
}

/** The `tokens` of a request's acquire. */
export function requestTokens(
  context: Context,
  model: Model<Api>,
  streamOptions: SimpleStreamOptions | undefined,
  outputTokens: number | undefined,
): TokenCounts {
  return {
    input: estimateInputTokens(context),
    output: estimateOutputTokens(model, streamOptions, outputTokens),
  };
}

function looksLikeJson(text: string): boolean {
  const first = text.trimStart()[0];
  return first === '{' || first === '[';
}

function jsonLength(value: unknown): number {
  try {
    return JSON.stringify(value)?.length ?? 0;
  } catch {
    return 0; // a cycle or a BigInt in tool arguments: the request fails elsewhere
  }
}
