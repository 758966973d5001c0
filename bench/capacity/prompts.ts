/**
 * The bench's prompts: questions over a document of varied length, most short, some long, a
 * few very long, as an agent serving people sees them. Each asks for an answer of a given
 * length, which the stand-in reads back (`answerTokensOf`) to size its answer and its latency.
 * Seeded: every configuration gets the same sequence.
 */

const words = (
  'the provider limit token budget request minute agent run answer document report model queue ' +
  'slot lease process database window refill bucket account tenant worker retry pause latency ' +
  'estimate usage output input header reset capacity throughput error status share fair order ' +
  'policy grant release settle charge refund burst steady load shared cluster region schedule'
).split(' ');

/** A small seeded generator (mulberry32): the same numbers for the same seed on every machine. */
export function seeded(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const between = (random: () => number, min: number, max: number) => Math.round(min + random() * (max - min));

/**
 * The document's size in tokens: 70% short (40-200), 25% a page or a few (200-1,000), 5% a
 * long report (1,500-5,000). Mean about 400 tokens; with answers of 50-300 tokens a request
 * averages about 550, so at 60,000 tokens a minute the account admits some 110 requests a
 * minute: tokens bind long before the 600 requests a minute do.
 */
function documentTokens(random: () => number): number {
  const r = random();
  if (r < 0.7) return between(random, 40, 200);
  if (r < 0.95) return between(random, 200, 1_000);
  return between(random, 1_500, 5_000);
}

/** The next prompts of one agent loop. */
export function promptSource(seed: number): () => string {
  const random = seeded(seed);
  return () => {
    const tokens = documentTokens(random);
    // About 4 characters a token: a word and its space are 6 to 10 characters, 1.5 to 2.5 tokens.
    const text: string[] = [];
    for (let chars = 0; chars < tokens * 4;) {
      const word = words[Math.floor(random() * words.length)]!;
      text.push(word);
      chars += word.length + 1;
    }
    const answer = between(random, 50, 300);
    return `Document:\n${text.join(' ')}\n\nSummarise it. Answer in about ${answer} tokens.`;
  };
}

/** The answer length a prompt asks for; 100 when it names none. */
export function answerTokensOf(prompt: string): number {
  const match = /Answer in about (\d+) tokens\.$/.exec(prompt);
  return match ? Number(match[1]) : 100;
}
