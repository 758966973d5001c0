import { setFlagsFromString } from 'node:v8';

/**
 * The V8 flags `sluice serve` sets in its process: allocation-site pretenuring off, unless the
 * command line sets it either way (`node --allocation-site-pretenuring .../sluice.js serve`
 * brings V8's default back; `NODE_OPTIONS` cannot carry it, Node refuses V8 flags there).
 *
 * Why: V8 watches which allocation sites make objects that outlive a young-generation
 * collection (a scavenge), and past a threshold it allocates their objects straight in the old
 * generation. A server's request objects die young, but a burst (64 requests in flight, a slow
 * upstream) makes them outlive a scavenge for a while, and their sites get pretenured. From then
 * on each request's pretenured objects die in the old generation, where only a full collection
 * frees them, and until it does they keep alive the young objects they point to, which each
 * scavenge then copies. Measured on the gateway at 542 streamed requests a second
 * (docs/benchmarks.md, "GC pauses of the gateway's process"): with pretenuring a scavenge took
 * 8 to 9 ms and kept about 1.9 MB, without it 3 to 4 ms and 0.3 to 0.6 MB; a bare node:http and
 * undici proxy, 1 ms and 16 KB.
 *
 * The cost falls on long-lived objects built in bulk, which are then copied once more before
 * they reach the old generation: a process that builds millions of them (not a server's work)
 * spends more time in GC without it.
 */
export function heapFlags(execArgv: readonly string[]): string[] {
  // V8 takes `-` or `_` between the words, one dash or two, and `no` with or without a dash.
  const given = execArgv.some((arg) =>
    /^--?(no-?)?allocation-site-pretenuring$/.test(arg.replaceAll('_', '-')),
  );
  return given ? [] : ['--no-allocation-site-pretenuring'];
}

let tuned = false;

/**
 * Sets `heapFlags` once per process. V8 reads this flag at each collection, so setting it at
 * run time takes effect, but only for sites not pretenured yet: call it when the process
 * starts, before it serves. `sluice serve` does; `serve()` does not (an application that embeds
 * the server keeps V8's defaults unless it calls this itself).
 */
export function tuneHeap(): void {
  if (tuned) return;
  tuned = true;
  for (const flag of heapFlags(process.execArgv)) setFlagsFromString(flag);
}
