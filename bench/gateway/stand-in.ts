/**
 * The bench's provider, in a process of its own: the testkit stand-in answering every chat
 * completion with the same text (`CHUNKS` stream chunks of 16 characters), at once.
 */
import { startProviderStandIn } from '@sluice/testkit';
import { answerBench } from './child.js';

const chunks = Number(process.env.CHUNKS ?? 32);
const text = 'x'.repeat(16 * chunks);
const provider = await startProviderStandIn({
  reply: () => ({ text, usage: { input: 20, output: chunks * 4 } }),
  keepAliveTimeoutMs: 120_000,
});
answerBench({ url: provider.url }, () => provider.close());
