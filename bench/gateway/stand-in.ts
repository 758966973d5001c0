/**
 * The bench's provider, in a process of its own: the testkit stand-in answering every chat
 * completion with the same text (`CHUNKS` stream chunks of 16 characters), at once.
 */
import { startProviderStandIn } from '@sluice/testkit';

const chunks = Number(process.env.CHUNKS ?? 32);
const text = 'x'.repeat(16 * chunks);
const provider = await startProviderStandIn({
  reply: () => ({ text, usage: { input: 20, output: chunks * 4 } }),
  keepAliveTimeoutMs: 120_000,
});
process.send!({ type: 'ready', url: provider.url });
process.on('message', (message: { type: string }) => {
  if (message.type === 'stop') void provider.close().then(() => process.exit(0));
});

// Gone with the bench: a parent that died does not leave this process behind.
process.once('disconnect', () => process.exit(0));
