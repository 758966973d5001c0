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
