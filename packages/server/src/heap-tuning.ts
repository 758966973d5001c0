import { setFlagsFromString } from 'node:v8';

/**
 * The V8 flags the server sets in its process: allocation-site pretenuring off, unless the
 * command line sets it either way (`node --allocation-site-pretenuring ...` brings V8's
 * default back).
 *
 * Why: V8 watches which allocation sites make objects that outlive a young-generation
 * collection (a scavenge), and past a threshold it allocates their objects straight in the old
 * generation. A server's request objects die young, but a burst (64 requests in flight, a slow
 * upstream) makes them outlive a scavenge for a while, and their sites get pretenured. From then
 * on each request's pretenured objects die in the old generation, where only a full collection
 * frees them, and until it does they keep alive the young objects they point to: every scavenge
 * copies a part of each request made since the last full collection. Measured on the gateway at
 * 542 streamed requests a second (docs/benchmarks.md, "GC pauses"): with pretenuring a scavenge
 * took 8 to 9 ms and kept about 1.9 MB, without it 3 to 4 ms and 0.3 to 0.6 MB; a bare node:http
 * and undici proxy, 1 ms and 16 KB.
 */
export function heapFlags(execArgv: readonly string[]): string[] {
  const given = execArgv.some((arg) => /^--(no-)?allocation[-_]site[-_]pretenuring(=|$)/.test(arg));
  return given ? [] : ['--no-allocation-site-pretenuring'];
}

let tuned = false;

/**
 * Sets `heapFlags` once per process (a process that serves several servers, a test run, sets
 * them once). V8 reads this flag at each collection, so setting it at run time takes effect.
 */
export function tuneHeap(): void {
  if (tuned) return;
  tuned = true;
  for (const flag of heapFlags(process.execArgv)) setFlagsFromString(flag);
}
