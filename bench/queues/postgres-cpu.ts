/**
 * CPU time used by this machine's PostgreSQL, read from /proc: every process named `postgres`
 * (the postmaster, its background processes, the backends), each with the time of its children
 * that have exited. A backend that ends is reaped by the postmaster, whose children's time then
 * holds it, so the sum only grows and a difference of two readings is the CPU spent between
 * them, whatever connections opened or closed meanwhile. Undefined where there is no /proc or no
 * local PostgreSQL (a server on another machine): the figure is then left out.
 */
import { readdirSync, readFileSync } from 'node:fs';

// Linux's clock ticks per second for the times in /proc/<pid>/stat (USER_HZ, 100 on every
// architecture Node runs on).
const TICK_US = 1_000_000 / 100;

export function postgresCpuUs(): number | undefined {
  let entries: string[];
  try {
    entries = readdirSync('/proc');
  } catch {
    return undefined;
  }
  let ticks = 0;
  let found = false;
  for (const pid of entries) {
    if (!/^\d+$/.test(pid)) continue;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    } catch {
      continue; // ended between the listing and the read
    }
    // The command name is in parentheses and may hold spaces; the fields follow its last ')'.
    const close = stat.lastIndexOf(')');
    if (stat.slice(stat.indexOf('(') + 1, close) !== 'postgres') continue;
    // From the state (field 3): utime, stime, cutime, cstime are fields 14 to 17.
    const fields = stat.slice(close + 2).split(' ');
    ticks += Number(fields[11]) + Number(fields[12]) + Number(fields[13]) + Number(fields[14]);
    found = true;
  }
  return found ? ticks * TICK_US : undefined;
}
