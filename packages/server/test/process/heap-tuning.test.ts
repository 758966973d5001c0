import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { heapFlags } from '../../src/heap-tuning.js';

const source = fileURLToPath(new URL('../../src/heap-tuning.ts', import.meta.url));
// The children get no NODE_OPTIONS (the test runner's could add warnings of their own).
const { NODE_OPTIONS: _, ...env } = process.env;

/** Runs `code` (an ES module) in a node started with `flags`; its stdout and stderr. */
function node(flags: string[], code: string) {
  const out = spawnSync(process.execPath, [...flags, '--import', 'tsx', '--input-type=module', '-e', code], {
    encoding: 'utf8',
    env,
  });
  return { status: out.status, stdout: out.stdout.trim(), stderr: out.stderr };
}

// V8's digest of its flags, the ones that change compiled code among them: two processes with
// the same tag run with the same setting of this flag.
const tagAfterTuning = (flags: string[]) =>
  node(
    flags,
    `import { cachedDataVersionTag } from 'node:v8';
     import { tuneHeap } from ${JSON.stringify(source)};
     tuneHeap();
     console.log(cachedDataVersionTag());`,
  );
const tagOf = (flags: string[]) =>
  node(flags, `import { cachedDataVersionTag } from 'node:v8'; console.log(cachedDataVersionTag());`);

describe('the V8 flags `sluice serve` sets in its process', () => {
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

  it("leaves it as an operator's command line sets it, in every spelling V8 takes", () => {
    for (const given of [
      '--allocation-site-pretenuring',
      '-allocation-site-pretenuring',
      '--allocation_site_pretenuring',
      '--no-allocation-site-pretenuring',
      '--noallocation-site-pretenuring',
      '--no_allocation_site_pretenuring',
      '-noallocation_site_pretenuring',
    ])
      expect(heapFlags(['--enable-source-maps', given]), given).toEqual([]);
  });

  it('takes effect at run time as the flag does on the command line, and yields to the command line', () => {
    const off = tagOf(['--no-allocation-site-pretenuring']);
    const on = tagOf([]);
    expect(off.status).toBe(0);
    // The tag tells the two settings apart, so the checks below can fail.
    expect(off.stdout).not.toBe(on.stdout);
    const tuned = tagAfterTuning([]);
    expect({ status: tuned.status, stderr: tuned.stderr, tag: tuned.stdout }).toEqual({
      status: 0,
      stderr: '',
      tag: off.stdout,
    });
    expect(tagAfterTuning(['--allocation-site-pretenuring']).stdout).toBe(on.stdout);
  });
});
