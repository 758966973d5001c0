import type { ProviderStandIn } from '@sluice/testkit';
import { startProviderStandIn } from '@sluice/testkit';
import { afterThisTest, lastUserText } from '../helpers.js';

/** A stand-in whose answer to a prompt waits until the test lets it go: `release(prompt)`. */
export async function gatedStandIn(): Promise<{
  provider: ProviderStandIn;
  release(prompt: string): void;
  releaseAll(): void;
}> {
  const gates = new Map<string, { promise: Promise<void>; resolve: () => void }>();
  const gate = (prompt: string) => {
    let entry = gates.get(prompt);
    if (!entry) {
      let resolve!: () => void;
      const promise = new Promise<void>((r) => (resolve = r));
      gates.set(prompt, (entry = { promise, resolve }));
    }
    return entry;
  };
  const provider = await startProviderStandIn({
    reply: async (request) => {
      const prompt = lastUserText(request);
      await gate(prompt).promise;
      return { text: `done ${prompt}`, usage: { input: 1, output: 1 } };
    },
  });
  const releaseAll = () => {
    for (const g of gates.values()) g.resolve();
  };
  afterThisTest(async () => {
    releaseAll();
    await provider.close();
  });
  return { provider, release: (prompt) => gate(prompt).resolve(), releaseAll };
}

/** The samples of a Prometheus text exposition: `name{label="v",...}` → value. */
export function parseMetrics(text: string): Map<string, number> {
  const samples = new Map<string, number>();
  for (const line of text.split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const match = /^([a-zA-Z_:][\w:]*)(\{.*\})? (\S+)$/.exec(line);
    if (!match) throw new Error(`not a sample line: ${line}`);
    samples.set(`${match[1]}${match[2] ?? ''}`, Number(match[3]));
  }
  return samples;
}

/** One sample; fails when the series is absent (an absent series is not a zero). */
export function sample(
  samples: Map<string, number>,
  name: string,
  labels: Record<string, string> = {},
): number {
  const key = `${name}${
    Object.keys(labels).length === 0
      ? ''
      : `{${Object.entries(labels)
          .map(([k, v]) => `${k}="${v}"`)
          .join(',')}}`
  }`;
  const value = samples.get(key);
  if (value === undefined) throw new Error(`no sample ${key}`);
  return value;
}

/** `GET /metrics` with a bearer secret (or none). */
export async function scrape(
  url: string,
  secret?: string,
): Promise<{ status: number; text: string; type: string }> {
  const r = await fetch(`${url}/metrics`, {
    headers: secret === undefined ? {} : { authorization: `Bearer ${secret}` },
  });
  return { status: r.status, text: await r.text(), type: r.headers.get('content-type') ?? '' };
}
