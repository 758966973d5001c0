/**
 * What each process of bench:gateway (the stand-in, the server, the bare proxy) says to the
 * bench over IPC: `ready` with its figures, its CPU time when asked (`cpu`, in µs, user and
 * system: the bench divides it over the requests), and it stops when told (`stop`) or when the
 * bench is gone, so a parent that died leaves no process behind.
 */
export function answerBench(ready: Record<string, string>, stop: () => Promise<void>): void {
  process.on('message', (message: { type: string }) => {
    if (message.type === 'cpu') {
      const { user, system } = process.cpuUsage();
      process.send!({ type: 'cpu', us: user + system });
      return;
    }
    if (message.type === 'stop') void stop().then(() => process.exit(0));
  });
  process.once('disconnect', () => process.exit(0));
  process.send!({ type: 'ready', ...ready });
}
