/**
 * The calls of bench:gateway: one call of the `openai` client, calls at a fixed concurrency
 * (the saturated phase), and calls on a fixed schedule given to the sides in turn, call by call
 * (the paced phase).
 */
import { performance } from 'node:perf_hooks';
import type OpenAI from 'openai';

export type Kind = 'json' | 'stream';

export interface Sample {
  latencies: number[];
  ms: number;
  requests: number;
}

/** One chat completion, non-streamed or streamed, its answer checked (`chunks` of 16 characters). */
export async function call(client: OpenAI, kind: Kind, chunks: number): Promise<void> {
  const messages = [{ role: 'user' as const, content: 'How long is a piece of string?' }];
  if (kind === 'json') {
    const answer = await client.chat.completions.create({ model: 'm', messages });
    if (answer.choices[0]?.message.content?.length !== 16 * chunks) throw new Error('a wrong answer');
    return;
  }
  let chars = 0;
  for await (const chunk of await client.chat.completions.create({ model: 'm', messages, stream: true }))
    chars += chunk.choices[0]?.delta.content?.length ?? 0;
  if (chars !== 16 * chunks) throw new Error('a wrong stream');
}

/** `total` calls, `concurrency` at a time, each starting when one ends; each call's latency. */
export async function saturated(
  client: OpenAI,
  kind: Kind,
  total: number,
  concurrency: number,
  chunks: number,
): Promise<Sample> {
  const latencies: number[] = [];
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < total) {
        next++;
        const t = performance.now();
        await call(client, kind, chunks);
        latencies.push(performance.now() - t);
      }
    }),
  );
  return { latencies, ms: performance.now() - started, requests: total };
}

/**
 * `perSide` calls to each of `sides`, on one fixed schedule of `rate` calls a second in all, the
 * sides taking the calls in turn (call i goes to side i mod n). A pause of the machine, or of the
 * load generator, then falls on every side alike, where in rounds of one side at a time it falls
 * on whichever side is running. Each side has at most `concurrency` calls in flight: a call due
 * while its side is at that cap waits in its side's own line and starts when one of that side's
 * calls ends, so a slow side never holds back the schedule of the others. Each call's latency is
 * counted from its scheduled time, so a side cannot hide its delay either. `heldByCap` counts the
 * calls that waited for their side's cap.
 */
export async function interleaved<Side extends string>(
  sides: readonly { side: Side; client: OpenAI }[],
  kind: Kind,
  rate: number,
  perSide: number,
  concurrency: number,
  chunks: number,
): Promise<{ samples: Record<Side, Sample>; heldByCap: number }> {
  const latencies = sides.map(() => [] as number[]);
  const inFlight = sides.map(() => 0);
  const held = sides.map(() => [] as number[]);
  let heldByCap = 0;
  const calls: Promise<void>[] = [];
  const begin = (i: number, due: number) => {
    inFlight[i]!++;
    calls.push(
      call(sides[i]!.client, kind, chunks).then(() => {
        latencies[i]!.push(performance.now() - due);
        inFlight[i]!--;
        const next = held[i]!.shift();
        if (next !== undefined) begin(i, next);
      }),
    );
  };
  const started = performance.now();
  const gap = 1000 / rate;
  const total = perSide * sides.length;
  for (let sent = 0; sent < total; sent++) {
    const due = started + sent * gap;
    const ahead = due - performance.now();
    if (ahead > 0.5) await new Promise((resolve) => setTimeout(resolve, ahead));
    const i = sent % sides.length;
    if (inFlight[i]! < concurrency) begin(i, due);
    else {
      heldByCap++;
      held[i]!.push(due);
    }
  }
  // Calls started from a side's line are pushed to `calls` as earlier ones end: wait until
  // every call of every side has ended.
  while (calls.length > 0) await Promise.all(calls.splice(0));
  const ms = performance.now() - started;
  const samples = Object.fromEntries(
    sides.map(({ side }, i) => [side, { latencies: latencies[i]!, ms, requests: perSide }]),
  ) as Record<Side, Sample>;
  return { samples, heldByCap };
}
