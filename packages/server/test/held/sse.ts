/** A Server-Sent Events reader over fetch, for streamed runs. */

export interface SseEvent {
  event: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- event bodies are checked field by field
  data: any;
}

export interface SseStream {
  status: number;
  headers: Headers;
  /** The next event (comments are counted, not returned); undefined once the stream ended. */
  next(): Promise<SseEvent | undefined>;
  /** Every event until the end. */
  rest(): Promise<SseEvent[]>;
  /** Comment lines seen so far. */
  readonly comments: number;
  /** The JSON body of a response that is not a stream (a refusal). */
  json(): Promise<Record<string, unknown>>;
  /** Goes away without reading the rest. */
  close(): void;
}

/** POSTs `body` and reads the answer as a stream of events. */
export async function openStream(url: string, token: string, body: unknown): Promise<SseStream> {
  const controller = new AbortController();
  const response = await fetch(url, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify(body),
    signal: controller.signal,
  });
  const reader = response.body!.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  let comments = 0;
  let ended = false;
  const next = async (): Promise<SseEvent | undefined> => {
    for (;;) {
      const at = buffer.indexOf('\n\n');
      if (at >= 0) {
        const block = buffer.slice(0, at);
        buffer = buffer.slice(at + 2);
        const lines = block.split('\n');
        if (lines.every((l) => l.startsWith(':'))) {
          comments += 1;
          continue;
        }
        const event = lines.find((l) => l.startsWith('event: '))?.slice(7) ?? 'message';
        const data = lines
          .filter((l) => l.startsWith('data: '))
          .map((l) => l.slice(6))
          .join('\n');
        return { event, data: JSON.parse(data) };
      }
      if (ended) return undefined;
      const chunk = await reader.read();
      if (chunk.done) ended = true;
      else buffer += decoder.decode(chunk.value, { stream: true });
    }
  };
  return {
    status: response.status,
    headers: response.headers,
    next,
    async rest() {
      const all: SseEvent[] = [];
      for (let e = await next(); e; e = await next()) all.push(e);
      return all;
    },
    get comments() {
      return comments;
    },
    async json() {
      let text = '';
      for (let c = await reader.read(); !c.done; c = await reader.read()) text += decoder.decode(c.value);
      return JSON.parse(text) as Record<string, unknown>;
    },
    close: () => controller.abort(),
  };
}
