import { StringDecoder } from 'node:string_decoder';
import type { TokenCounts } from 'sluice';

/**
 * The usage a response reports, read from a copy of its body as it passes (the caller's bytes
 * are never held back for it). Both APIs and all their shapes have one reader each for JSON
 * and for event streams:
 * - OpenAI chat completions and embeddings: `usage.prompt_tokens`, `usage.completion_tokens`
 *   (a stream's last chunk when the caller asks `stream_options.include_usage`);
 * - OpenAI responses: `usage.input_tokens`, `usage.output_tokens` (a stream's
 *   `response.completed` carries them in `response.usage`);
 * - Anthropic messages: `usage.input_tokens` (plus the cache's input), `usage.output_tokens`;
 *   a stream's `message_start` has the input, each `message_delta` the output so far.
 */
export interface UsageReader {
  push(chunk: Buffer): void;
  /** The usage seen, once the body has ended; undefined when the response reported none. */
  end(): TokenCounts | undefined;
}

type Partial = { input?: number; output?: number };

const count = (value: unknown): number | undefined =>
  typeof value === 'number' && Number.isFinite(value) && value >= 0 ? value : undefined;

/** The figures of one `usage` object, whichever API wrote it. */
function figuresOf(usage: unknown): Partial | undefined {
  if (usage === null || typeof usage !== 'object') return undefined;
  const u = usage as Record<string, unknown>;
  const prompt = count(u.prompt_tokens) ?? count(u.input_tokens);
  const cached = (count(u.cache_creation_input_tokens) ?? 0) + (count(u.cache_read_input_tokens) ?? 0);
  const input = prompt === undefined ? undefined : prompt + cached;
  const output = count(u.completion_tokens) ?? count(u.output_tokens);
  if (input === undefined && output === undefined) return undefined;
  return { input, output };
}

/** Where a usage object sits in a body or an event: at the top, in `response`, in `message`. */
function usageIn(value: unknown): Partial | undefined {
  if (value === null || typeof value !== 'object') return undefined;
  const v = value as Record<string, unknown>;
  return (
    figuresOf(v.usage) ??
    figuresOf((v.response as Record<string, unknown> | undefined)?.usage) ??
    figuresOf((v.message as Record<string, unknown> | undefined)?.usage)
  );
}

/** Later figures replace earlier ones (Anthropic's output count grows event by event). */
function merge(into: Partial, from: Partial | undefined): void {
  if (from?.input !== undefined && (from.input > 0 || into.input === undefined)) into.input = from.input;
  if (from?.output !== undefined) into.output = from.output;
}

const settled = (seen: Partial): TokenCounts | undefined =>
  seen.input === undefined && seen.output === undefined
    ? undefined
    : { input: seen.input ?? 0, output: seen.output ?? 0 };

/** The most of a JSON body kept to read its usage; a bigger body keeps the estimate. */
const MAX_JSON_BYTES = 8 * 1024 * 1024;

export function jsonUsageReader(): UsageReader {
  const chunks: Buffer[] = [];
  let bytes = 0;
  return {
    push(chunk) {
      bytes += chunk.length;
      if (bytes <= MAX_JSON_BYTES) chunks.push(chunk);
    },
    end() {
      if (bytes === 0 || bytes > MAX_JSON_BYTES) return undefined;
      try {
        const seen: Partial = {};
        merge(seen, usageIn(JSON.parse(Buffer.concat(chunks, bytes).toString('utf8'))));
        return settled(seen);
      } catch {
        return undefined;
      }
    },
  };
}

/** A line longer than this is not an event the gateway reads: it is skipped. */
const MAX_LINE_CHARS = 1024 * 1024;

/**
 * Reads `data:` lines of an event stream. Only lines that hold `"usage"` are parsed, so the
 * text deltas that make up most of a stream cost a search, not a parse.
 */
export function sseUsageReader(): UsageReader {
  const decoder = new StringDecoder('utf8');
  const seen: Partial = {};
  let rest = '';
  const line = (text: string) => {
    if (!text.startsWith('data:') || !text.includes('"usage"')) return;
    try {
      merge(seen, usageIn(JSON.parse(text.slice(5))));
    } catch {
      // Not JSON: not an event this reader knows.
    }
  };
  return {
    push(chunk) {
      const text = rest + decoder.write(chunk);
      let start = 0;
      for (let nl = text.indexOf('\n'); nl >= 0; nl = text.indexOf('\n', start)) {
        const end = nl > start && text.charCodeAt(nl - 1) === 13 ? nl - 1 : nl;
        line(text.slice(start, end));
        start = nl + 1;
      }
      rest = text.length - start > MAX_LINE_CHARS ? '' : text.slice(start);
    },
    end() {
      line(rest + decoder.end());
      rest = '';
      return settled(seen);
    },
  };
}
