import { describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { afterThisTest, startTestServer } from '../helpers.js';

// A socket's runs sent with on_disconnect: 'cancel' listen for the socket's close, one listener
// each on the socket's one signal. A run that has ended has nothing left to cancel: its listener
// must go with it, or a long-lived socket gathers one per run it ever had.

describe("a WebSocket's ended runs", () => {
  it("leave no close listener behind: a socket's 12th run with on_disconnect 'cancel' raises no listener-leak warning", async () => {
    const t = await startTestServer();
    const warnings: string[] = [];
    const onWarning = (warning: Error) => warnings.push(`${warning.name}: ${warning.message}`);
    process.on('warning', onWarning);
    afterThisTest(() => void process.off('warning', onWarning));

    const socket = new WebSocket(`${t.server.url.replace('http', 'ws')}/api/client/v1/ws`, {
      headers: { authorization: `Bearer ${t.admin}` },
    });
    afterThisTest(() => socket.terminate());
    await new Promise((resolve) => socket.once('open', resolve));
    const ends: string[] = [];
    let ended: (() => void) | undefined;
    socket.on('message', (data) => {
      const frame = JSON.parse(String(data)) as { type: string; request_id: string };
      if (frame.type === 'run.completed' || frame.type === 'error') {
        ends.push(`${frame.request_id} ${frame.type}`);
        ended?.();
      }
    });
    for (let i = 0; i < 12; i++) {
      const done = new Promise<void>((resolve) => (ended = resolve));
      socket.send(
        JSON.stringify({
          type: 'run',
          request_id: `r${i}`,
          agent: 'echo',
          input: 'hi',
          on_disconnect: 'cancel',
        }),
      );
      await done;
    }
    // Node emits the warning on a later tick.
    await new Promise((resolve) => setImmediate(resolve));
    expect(ends).toEqual(Array.from({ length: 12 }, (_, i) => `r${i} run.completed`));
    expect(warnings.filter((w) => w.startsWith('MaxListenersExceededWarning'))).toEqual([]);
  });
});
