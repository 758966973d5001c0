import { getEventListeners } from 'node:events';
import { describe, expect, it } from 'vitest';
import { LinkedAbort } from '../../src/agent/signals.js';

describe('LinkedAbort on a shared source', () => {
  it('30 links of one run signal (its tool calls, its children) put one listener on it', () => {
    const run = new AbortController();
    const links = Array.from({ length: 30 }, () => new LinkedAbort([run.signal]));
    expect(getEventListeners(run.signal, 'abort')).toHaveLength(1);
    // One ends early: the others stay linked.
    links[0]!.dispose();
    const reason = new Error('the run was cancelled');
    run.abort(reason);
    expect(links[0]!.signal.aborted).toBe(false);
    expect(links.slice(1).every((link) => link.signal.reason === reason)).toBe(true);
    expect(getEventListeners(run.signal, 'abort')).toHaveLength(0);
  });

  it('disposed links leave nothing on any source', () => {
    const a = new AbortController();
    const b = new AbortController();
    for (let i = 0; i < 50; i++) new LinkedAbort([a.signal, b.signal, a.signal]).dispose();
    expect(getEventListeners(a.signal, 'abort')).toHaveLength(0);
    expect(getEventListeners(b.signal, 'abort')).toHaveLength(0);
  });

  it('a link aborted by hand lets go of its sources; one aborted already starts aborted', () => {
    const source = new AbortController();
    const link = new LinkedAbort([source.signal]);
    link.abort(new Error('timeout'));
    expect(getEventListeners(source.signal, 'abort')).toHaveLength(0);
    const gone = new LinkedAbort([AbortSignal.abort('before')]);
    expect(gone.signal.reason).toBe('before');
  });
});
