import { spawnSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { heapFlags } from '../../src/heap-tuning.js';

describe('the V8 flags the server sets in its process', () => {
  it('turns allocation-site pretenuring off when the command line says nothing of it', () => {
    expect(heapFlags([])).toEqual(['--no-allocation-site-pretenuring']);
    expect(heapFlags(['--max-old-space-size=512', '--conditions=@sluice/source'])).toEqual([
      '--no-allocation-site-pretenuring',
    ]);
    // A flag whose name only begins the same is another flag.
    expect(heapFlags(['--allocation-site-pretenuring-something'])).toEqual([
      '--no-allocation-site-pretenuring',
    ]);
  });

  it("leaves it as an operator's command line sets it, either way and in either spelling", () => {
    for (const given of [
      '--allocation-site-pretenuring',
      '--no-allocation-site-pretenuring',
      '--allocation_site_pretenuring',
      '--no-allocation_site_pretenuring',
    ])
      expect(heapFlags(['--enable-source-maps', given])).toEqual([]);
  });

  it('is a flag this Node accepts at run time', () => {
    // V8 says nothing of a flag it knows, and reports one it does not know on stderr.
    const set = (flag: string) =>
      spawnSync(process.execPath, ['-e', `require('node:v8').setFlagsFromString(${JSON.stringify(flag)})`], {
        encoding: 'utf8',
      });
    const ours = set(heapFlags([])[0]!);
    expect({ status: ours.status, stderr: ours.stderr }).toEqual({ status: 0, stderr: '' });
    // The check can fail: this is what an unknown flag gives.
    expect(set('--no-such-v8-flag-at-all').stderr).toMatch(/unrecognized flag/i);
  });
});
