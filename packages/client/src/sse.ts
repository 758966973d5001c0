/**
 * One Server-Sent Events frame (the lines up to a blank one), as the WHATWG parsing rules read
 * it. A frame with data is an event; one without data can still carry an `id:` (it moves the
 * resume point, as EventSource's lastEventId) or a `retry:`; comment-only frames are skipped.
 */
export interface SseFrame {
  /** The frame's `id:` field, when it has one (one containing NUL is ignored). */
  id: string | undefined;
  /** The frame's `event:` field; `message` when it has none or an empty one. */
  event: string;
  /** The `data:` lines joined with LF; undefined for a frame without data (no event). */
  data: string | undefined;
  /** The frame's `retry:` field (the reconnection time, in ms), when it is a whole number. */
  retry: number | undefined;
}

/**
 * The frames of an SSE body, in order. Lines end with CRLF, LF or a lone CR, wherever the
 * chunks split them (a CR ending one chunk waits for the next to tell). A frame the body ends
 * in the middle of is dropped: it was cut. Leaving early cancels the body (closing the
 * connection).
 */
export async function* readSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseFrame> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  // The text before this holds no line end: a long line sent in many chunks is scanned once.
  let searched = 0;
  let frame = emptyFrame();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return;
      text += decoder.decode(value, { stream: true });
      let start = 0;
      let lf = text.indexOf('\n', searched);
      let cr = text.indexOf('\r', searched);
      for (;;) {
        if (lf >= 0 && lf < start) lf = text.indexOf('\n', start);
        if (cr >= 0 && cr < start) cr = text.indexOf('\r', start);
        let end: number;
        let next: number;
        if (cr >= 0 && (lf < 0 || cr < lf)) {
          // A CR last in the text: its LF, if any, is in the next chunk.
          if (cr === text.length - 1) break;
          end = cr;
          next = text[cr + 1] === '\n' ? cr + 2 : cr + 1;
        } else if (lf >= 0) {
          end = lf;
          next = lf + 1;
        } else break;
        const line = text.slice(start, end);
        start = next;
        if (line === '') {
          if (frame.data !== undefined || frame.id !== undefined || frame.retry !== undefined) yield frame;
          frame = emptyFrame();
        } else readLine(frame, line);
      }
      text = text.slice(start);
      searched = text.endsWith('\r') ? text.length - 1 : text.length;
    }
  } finally {
    await reader.cancel().catch(() => {});
  }
}

const emptyFrame = (): SseFrame => ({ id: undefined, event: 'message', data: undefined, retry: undefined });

function readLine(frame: SseFrame, line: string): void {
  if (line.startsWith(':')) return;
  const at = line.indexOf(':');
  const field = at < 0 ? line : line.slice(0, at);
  const value = at < 0 ? '' : line.slice(at + 1).replace(/^ /, '');
  if (field === 'data') frame.data = frame.data === undefined ? value : `${frame.data}\n${value}`;
  else if (field === 'event') frame.event = value || 'message';
  else if (field === 'id' && !value.includes('\0')) frame.id = value;
  else if (field === 'retry' && /^\d+$/.test(value)) frame.retry = Number(value);
}
