import { PerformanceObserver } from 'node:perf_hooks';

/** What a process says of its own use when asked (`cpu`): its CPU time and its GC pauses so far. */
export interface ChildUse {
  /** CPU time, user and system, in µs: the bench divides it over the requests. */
  us: number;
  /** Garbage collections so far, and their pauses' total (ms): what stopped its event loop. */
  gcs: number;
  gcMs: number;
  /** The longest pause since the last time it was asked. */
  gcMaxMs: number;
}

/**
 * What each process of bench:gateway (the stand-in, the server, the bare proxy) says to the
 * bench over IPC: `ready` with its figures, its CPU time and GC pauses when asked (`cpu`), and
 * it stops when told (`stop`) or when the bench is gone, so a parent that died leaves no
 * process behind.
 */
export function answerBench(ready: Record<string, string>, stop: () => Promise<void>): void {
  const gc = { count: 0, ms: 0, maxMs: 0 };
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      gc.count++;
      gc.ms += entry.duration;
      gc.maxMs = Math.max(gc.maxMs, entry.duration);
    }
  }).observe({ entryTypes: ['gc'] });
  process.on('message', (message: { type: string }) => {
    if (message.type === 'cpu') {
      const { user, system } = process.cpuUsage();
      const use: ChildUse = { us: user + system, gcs: gc.count, gcMs: gc.ms, gcMaxMs: gc.maxMs };
      gc.maxMs = 0;
      process.send!({ type: 'cpu', ...use });
      return;
    }
    if (message.type === 'stop') void stop().then(() => process.exit(0));
  });
  process.once('disconnect', () => process.exit(0));
  process.send!({ type: 'ready', ...ready });
}
