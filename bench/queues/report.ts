/** The tables and the last JSON line of bench:queues. */
import type { EndToEndFigures, EnqueueFigures } from './phases.js';

export const SLUICE = 'sluice';

/** A CPU figure per request or run (µs), or '-' where PostgreSQL is not on this machine. */
export const micros = (us: number | undefined) => (us === undefined ? '-' : us.toFixed(0));

export function table(header: string[], rows: string[][]): string {
  const widths = header.map((_, i) => Math.max(...[header, ...rows].map((row) => row[i]!.length)));
  const line = (row: string[]) => `| ${row.map((cell, i) => cell.padEnd(widths[i]!)).join(' | ')} |`;
  return [line(header), `|${widths.map((w) => '-'.repeat(w + 2)).join('|')}|`, ...rows.map(line)].join('\n');
}

/** Sluice's figure over the best peer's (higher is better for both). */
export function versusBest(by: Map<string, number>): { ratio: number; best: string } {
  const peers = [...by].filter(([name]) => name !== SLUICE);
  const [best, figure] = peers.reduce((a, b) => (b[1] > a[1] ? b : a));
  return { ratio: figure > 0 ? Number((by.get(SLUICE)! / figure).toFixed(2)) : NaN, best };
}

export function enqueueRows(clients: number, by: Map<string, EnqueueFigures>): string[][] {
  const { ratio, best } = versusBest(new Map([...by].map(([n, f]) => [n, f.rps])));
  return [...by].map(([name, f]) => [
    name,
    String(clients),
    f.rps.toFixed(0),
    f.p50.toFixed(1),
    f.p99.toFixed(1),
    micros(f.cpuUs),
    micros(f.postgresCpuUs),
    name === SLUICE ? `${ratio.toFixed(2)}x ${best}` : `${(f.rps / by.get(SLUICE)!.rps).toFixed(2)}x sluice`,
  ]);
}

/** Every tenant's running peak at or under the cap. */
export const keptCap = (f: EndToEndFigures, cap: number) => Object.values(f.peaks).every((p) => p <= cap);

/** The watched tenant had more runs open at once than the cap lets run: the cap decided something. */
export const capBinding = (f: EndToEndFigures, cap: number) => f.demand > cap;

/** The watched tenant ran as many at once as the cap allows (a cap kept by running less is no cap). */
export const reachedCap = (f: EndToEndFigures, cap: number) => (f.peaks[f.watched] ?? 0) >= cap;

export function endToEndRows(label: string, by: Map<string, EndToEndFigures>, cap?: number): string[][] {
  const { ratio, best } = versusBest(new Map([...by].map(([n, f]) => [n, f.rate])));
  return [...by].map(([name, f]) => [
    name,
    label,
    `${f.runs}${f.finished ? '' : ' (timed out)'}${f.failed ? `, ${f.failed} failed` : ''}`,
    f.seconds.toFixed(1),
    f.rate.toFixed(1),
    micros(f.cpuUs),
    micros(f.postgresCpuUs),
    name === SLUICE
      ? `${ratio.toFixed(2)}x ${best}`
      : `${(f.rate / by.get(SLUICE)!.rate).toFixed(2)}x sluice`,
    ...(cap === undefined
      ? []
      : [
          String(f.demand),
          String(f.peaks[f.watched] ?? 0),
          String(Math.max(0, ...Object.values(f.peaks))),
          keptCap(f, cap) ? 'yes' : 'no',
          reachedCap(f, cap) ? 'yes' : 'no',
        ]),
  ]);
}
