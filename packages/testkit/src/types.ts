import type { IncomingHttpHeaders } from 'node:http';
/** The stand-in's options, its replies and what it records of each request. */

/** What the stand-in answers to one request. */
export type Reply =
  /** An assistant message with text. */
  | { text: string; usage?: { input: number; output: number } }
  /** An assistant message asking for tool calls (and optional text before them). */
  | {
      toolCalls: { name: string; arguments: unknown; id?: string }[];
      text?: string;
      usage?: { input: number; output: number };
    }
  /** An HTTP error, as a provider sends it: 429 with `retryAfterSeconds`, 500, 401, 529... */
  | { status: number; message?: string; retryAfterSeconds?: number }
  /** The connection is cut: before any response, or in the middle of the stream. */
  | { drop: 'before-response' | 'mid-stream' }
  /** The stream starts, then nothing more comes until the client gives up. */
  | { stall: true };

/**
 * A request as the responder sees it. Both protocols are shown in the OpenAI shape: the
 * system prompt as a `system` message, tool results as `tool` messages.
 */
export interface StandInRequest {
  /** 1 for the first request the stand-in received, and so on. */
  readonly index: number;
  /** Which wire protocol the request came in. */
  readonly api: 'openai-completions' | 'openai-responses' | 'anthropic-messages';
  readonly model: string;
  readonly messages: readonly {
    role: string;
    content?: unknown;
    tool_call_id?: string;
    tool_calls?: unknown[];
  }[];
  readonly tools: readonly { function?: { name?: string } }[];
  /** The images of the user messages, in order, whichever protocol carried them. */
  readonly images: readonly StandInImage[];
  readonly stream: boolean;
  /** The bearer token the client sent. */
  readonly apiKey: string | undefined;
  readonly body: Record<string, unknown>;
}

/** An image a request carried: its bytes (base64) and their size and SHA-256, to compare with what was sent. */
export interface StandInImage {
  readonly mimeType: string;
  readonly data: string;
  readonly bytes: number;
  readonly sha256: string;
  /** Set for an image sent by remote URL instead of bytes (then `data` is empty). */
  readonly url?: string;
}

export interface RequestRecord {
  readonly index: number;
  readonly method: string;
  /** The request target as it came: path and query. */
  readonly path: string;
  /** Every header as received (what a test checks a gateway forwarded, and what it did not). */
  readonly headers: Readonly<IncomingHttpHeaders>;
  readonly model: string;
  readonly apiKey: string | undefined;
  readonly stream: boolean;
  readonly messageCount: number;
  /** The images the request carried: mime type, size and SHA-256 (not the bytes). */
  readonly images: readonly Omit<StandInImage, 'data'>[];
  status: number | undefined;
  /** Which of the account's limits refused the request with a 429; undefined when none did. */
  rateLimited?: LimitName | undefined;
  /** The client closed the connection before the response was complete. */
  aborted: boolean;
  done: boolean;
}

/** The limits of a provider account (see `StandInOptions.limits`); each is optional. */
export interface StandInLimits {
  /** Requests answered at once. */
  maxConcurrent?: number;
  requestsPerMinute?: number;
  /** Prompt plus output tokens per minute. */
  tokensPerMinute?: number;
}

/** The limit that refused a request. */
export type LimitName = 'concurrent' | 'requests' | 'tokens';

export interface StandInOptions {
  /** Decides each reply. Default: echo the last user message, and note each image (` [image image/png, 68 bytes]`). */
  reply?: (request: StandInRequest) => Reply | Promise<Reply>;
  /** Wait before the response starts (ms), or a function of the request. @default 0 */
  latencyMs?: number | ((request: StandInRequest) => number);
  /** Wait between streamed chunks (ms). @default 0 */
  chunkDelayMs?: number;
  /**
   * How long an idle kept-alive connection stays open (a benchmark's clients on a loaded machine
   * want it long, so no request races the close). @default Node's, 5 s
   */
  keepAliveTimeoutMs?: number;
  /** Port on 127.0.0.1. @default 0 (any free port) */
  port?: number;
  /**
   * Makes the stand-in behave like a provider account with these limits: a request past one
   * is answered 429 (with `retry-after` and `retry-after-ms`) in the protocol's error shape,
   * and every response carries the protocol's rate-limit headers. How requests and tokens are
   * counted: see `ProviderAccount`. @default no limits, no rate-limit headers
   */
  limits?: StandInLimits;
  /**
   * Time source of the account's budgets and of the times in its headers (a `ManualClock`
   * from `sluice/concurrency` fits). Latency and chunk delays stay real timers. @default Date
   */
  clock?: { now(): number };
}

export interface ProviderStandIn {
  /** Base URL for an OpenAI-compatible client, e.g. `http://127.0.0.1:40123/v1`. */
  readonly url: string;
  /** Base URL for an Anthropic client (it adds `/v1/messages`), e.g. `http://127.0.0.1:40123`. */
  readonly anthropicUrl: string;
  readonly port: number;
  /** Requests whose response is not finished and whose connection is open. */
  readonly inFlight: number;
  /** The highest `inFlight` seen since start (or the last `resetPeak`). */
  readonly peakInFlight: number;
  /** Every request received, in order. */
  readonly requests: readonly RequestRecord[];
  /** Requests answered 429 because a limit of `limits` was reached (scripted 429s not included). */
  readonly rateLimited: number;
  resetPeak(): void;
  /** Resolves once `inFlight` is 0. */
  idle(): Promise<void>;
  close(): Promise<void>;
}
