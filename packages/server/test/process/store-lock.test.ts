import { existsSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { expect, it } from 'vitest';
import { openStore } from '@sluice/server';
import { storeOpener, tempDir } from './harness.js';

const modeOf = (path: string) => statSync(path).mode & 0o777;

it('L11: the embedded store is private to its user: .sluice and its database folder 0700, the lock file 0600', async () => {
  const dataDir = join(tempDir(), '.sluice', 'db');
  const store = await openStore({ dataDir });
  try {
    expect(modeOf(join(dataDir, '..'))).toBe(0o700);
    expect(modeOf(dataDir)).toBe(0o700);
    expect(modeOf(`${dataDir}.lock`)).toBe(0o600);
  } finally {
    await store.close();
  }
  expect(existsSync(`${dataDir}.lock`)).toBe(false);
}, 120_000);

it('L11: two openStore calls on one folder at once, in one process: exactly one opens it, the other names the folder in use', async () => {
  const dataDir = join(tempDir(), '.sluice', 'db');
  const results = await Promise.allSettled([openStore({ dataDir }), openStore({ dataDir })]);
  const opened = results.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const refused = results.flatMap((r) => (r.status === 'rejected' ? [String(r.reason)] : []));
  for (const store of opened) await store.close();
  expect(opened).toHaveLength(1);
  expect(refused).toEqual([expect.stringContaining(`${dataDir} is in use`)]);
  expect(existsSync(`${dataDir}.lock`)).toBe(false);
}, 120_000);

it('L11: two processes opening one folder at the same moment: exactly one opens it, the other exits refused; the lock goes with the store', async () => {
  const dataDir = join(tempDir(), '.sluice', 'db');
  const openers = await Promise.all([storeOpener(dataDir), storeOpener(dataDir)]);
  // Both are loaded and waiting: the line starts both attempts together.
  for (const opener of openers) opener.child.stdin!.write('go\n');
  const outcomes = await Promise.all(
    openers.map((opener) => opener.waitFor(/^(opened|refused: .*)$/m).then((m) => m[1]!)),
  );
  const winner = openers[outcomes.findIndex((o) => o === 'opened')];
  expect(outcomes.filter((o) => o === 'opened')).toHaveLength(1);
  expect(outcomes.filter((o) => o.startsWith('refused'))).toEqual([
    expect.stringContaining(`is in use by process ${winner!.pid}`),
  ]);
  const loser = openers.find((o) => o !== winner)!;
  expect(await loser.closed).toEqual({ code: 1, signal: null });
  expect(existsSync(`${dataDir}.lock`)).toBe(true);
  winner!.child.kill('SIGTERM');
  expect(await winner!.closed).toEqual({ code: 0, signal: null });
  expect(existsSync(`${dataDir}.lock`)).toBe(false);
}, 120_000);
