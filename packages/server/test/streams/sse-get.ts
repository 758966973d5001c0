/** Reads `GET .../events` as Server-Sent Events, ids included (the test's own small parser). */

export interface IdEvent {
  id: number | undefined;
  event: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- event bodies are checked field by field
  data: any;
}

/** Every event of an SSE body until it ends. */
export async function readEvents(response: Response): Promise<IdEvent[]> {
  const text = await response.text();
  return parseBlocks(text);
}

export function parseBlocks(text: string): IdEvent[] {
  const out: IdEvent[] = [];
  for (const block of text.split('\n\n')) {
    const lines = block.split('\n').filter((l) => l !== '' && !l.startsWith(':'));
    if (lines.length === 0) continue;
    const field = (name: string) => lines.find((l) => l.startsWith(`${name}: `))?.slice(name.length + 2);
    const id = field('id');
    out.push({
      id: id === undefined ? undefined : Number(id),
      event: field('event')!,
      data: JSON.parse(field('data')!),
    });
  }
  return out;
}

/** GET a run's events with `headers` (Last-Event-ID, say); the response, unread. */
export function getEvents(
  base: string,
  token: string,
  runId: string,
  options: { after?: string; lastEventId?: string } = {},
) {
  const query = options.after === undefined ? '' : `?after=${encodeURIComponent(options.after)}`;
  return fetch(`${base}/api/client/v1/agents/runs/${runId}/events${query}`, {
    headers: {
      authorization: `Bearer ${token}`,
      ...(options.lastEventId === undefined ? {} : { 'last-event-id': options.lastEventId }),
    },
  });
}

/** POSTs a streamed run and reads its whole SSE body: the events as the client got them. */
export async function postStream(url: string, token: string, body: unknown): Promise<IdEvent[]> {
  const response = await fetch(url, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return parseBlocks(await response.text());
}
