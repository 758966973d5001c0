import type { Context, Message } from '@mariozechner/pi-ai';

const summaryInstructions =
  'You compress conversations. Summarise the conversation below so that it can be continued ' +
  'from the summary alone: keep facts, figures, decisions, tool results that matter, and open questions. ' +
  'Answer with the summary only.';

function render(message: Message): string {
  const content =
    typeof message.content === 'string'
      ? message.content
      : message.content
          .map((c) =>
            c.type === 'text'
              ? c.text
              : c.type === 'toolCall'
                ? `[call ${c.name} ${JSON.stringify(c.arguments)}]`
                : '',
          )
          .join(' ');
  const who = message.role === 'toolResult' ? `tool ${message.toolName}` : message.role;
  return `${who}: ${content}`;
}

/**
 * Replaces all but the last `keepLast` messages by one summary message. The kept part never
 * starts with a tool result, so a tool call and its result stay together. The summary itself
 * is a provider request (`summarize`), which takes a slot like any other.
 */
export async function compactMessages(
  messages: readonly Message[],
  options: { keepLast: number; now: () => number; summarize: (context: Context) => Promise<string> },
): Promise<Message[]> {
  let cut = Math.max(0, messages.length - options.keepLast);
  while (cut > 0 && messages[cut]?.role === 'toolResult') cut--;
  if (cut === 0) return [...messages];
  const older = messages.slice(0, cut);
  const summary = await options.summarize({
    systemPrompt: summaryInstructions,
    messages: [{ role: 'user', content: older.map(render).join('\n'), timestamp: options.now() }],
  });
  return [
    { role: 'user', content: `Summary of the conversation so far:\n${summary}`, timestamp: options.now() },
    ...messages.slice(cut),
  ];
}

export interface RunCompactionOptions {
  /** Compact before a turn whose context's JSON is longer than this; undefined: never by size. */
  readonly maxChars: number | undefined;
  readonly keepLast: number;
  readonly now: () => number;
  /** Sends the summary request (with a slot of its own) and returns its text. */
  readonly summarize: (context: Context) => Promise<string>;
}

/**
 * When one run's conversation is summarised: before a turn whose context has grown past
 * `maxChars`, and when the provider reports an overflow. After an overflow the request that
 * overflowed is resent compacted, and the run's own conversation is compacted before its next
 * turn too, so the following requests do not overflow again.
 */
export class RunCompaction {
  readonly #options: RunCompactionOptions;
  #afterOverflow = false;

  constructor(options: RunCompactionOptions) {
    this.#options = options;
  }

  summarize(messages: readonly Message[]): Promise<Message[]> {
    const { keepLast, now, summarize } = this.#options;
    return compactMessages(messages, { keepLast, now, summarize });
  }

  /** The provider said `context` is too long: the smaller context to resend instead. */
  async overflowed(context: Context): Promise<Context> {
    this.#afterOverflow = true;
    return { ...context, messages: await this.summarize(context.messages) };
  }

  /**
   * The loop's context before a turn, compacted when it is due. A summary that fails rejects,
   * so the run ends with its failure before another request is sent.
   */
  async beforeTurn<M>(current: M[]): Promise<M[]> {
    const { maxChars } = this.#options;
    const tooLarge = maxChars !== undefined && JSON.stringify(current).length > maxChars;
    if (!tooLarge && !this.#afterOverflow) return current;
    this.#afterOverflow = false;
    return (await this.summarize(current as Message[])) as M[];
  }
}
