import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

/**
 * Every change of a run's status is made by runs/lifecycle.ts, so a reader finds them all in
 * one file under its drawing. This reads the server's sources and migrations for statements
 * that write `agent_runs.status` and fails on one anywhere else.
 */

const serverDir = fileURLToPath(new URL('../../', import.meta.url));
const lifecycleFile = 'src/runs/lifecycle.ts';

function filesUnder(dir: string, ending: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return filesUnder(path, ending);
    return entry.name.endsWith(ending) ? [path] : [];
  });
}

/**
 * Where `text` writes a run's status: an UPDATE of agent_runs whose SET list assigns `status`
 * (however the SET list is laid out), or an INSERT into agent_runs that names the column.
 * Each hit is an offset into `text`.
 */
function statusWrites(text: string): number[] {
  const hits: number[] = [];
  const update =
    /\bUPDATE\s+agent_runs\b(?:\s+(?:AS\s+)?\w+)?\s+SET\b([\s\S]*?)(?:\bWHERE\b|\bRETURNING\b|\bFROM\b|`|;|$)/gi;
  for (const m of text.matchAll(update)) {
    if (/(^|[\s,(.])status\s*=/i.test(m[1]!)) hits.push(m.index);
  }
  for (const m of text.matchAll(/\bINSERT\s+INTO\s+agent_runs\s*\(([^)]*)\)/gi)) {
    if (/\bstatus\b/i.test(m[1]!)) hits.push(m.index);
  }
  return hits;
}

/** The name of the function (TypeScript or SQL) that holds `offset`. */
function enclosingFunction(text: string, offset: number): string {
  const before = text.slice(0, offset);
  const names = [...before.matchAll(/(?:\bfunction\s+|\bFUNCTION\s+)(\w+)\s*\(/g)];
  return names.at(-1)?.[1] ?? '(top level)';
}

describe('status writes', () => {
  it('the scanner finds the shapes a status write takes', () => {
    const shapes = [
      "UPDATE agent_runs SET status = 'queued' WHERE id = $1",
      "UPDATE agent_runs r SET status = 'failed', finished_at = clock_timestamp() WHERE r.status = 'running'",
      'UPDATE agent_runs SET finished_at = now(),\n  status = CASE WHEN x THEN 1 END WHERE true',
      'update agent_runs set usage = $2, status=$3 where id = $1',
      'INSERT INTO agent_runs (id, tenant, status, input) VALUES ($1, $2, $3, $4)',
    ];
    for (const shape of shapes) expect(statusWrites(shape), shape).toHaveLength(1);
    const notWrites = [
      "UPDATE agent_runs SET cancel_requested_at = now() WHERE status = 'running'",
      'UPDATE agent_runs SET thread_id = $2 WHERE id = $1',
      "UPDATE threads SET status = 'x' WHERE id = $1",
      'INSERT INTO agent_runs_archive (id, status) VALUES ($1, $2)',
      "SELECT id FROM agent_runs WHERE status = 'queued'",
    ];
    for (const shape of notWrites) expect(statusWrites(shape), shape).toEqual([]);
  });

  it('no TypeScript file of the server but runs/lifecycle.ts writes a status', () => {
    const outside = filesUnder(join(serverDir, 'src'), '.ts')
      .map((path) => relative(serverDir, path))
      .filter((file) => file !== lifecycleFile)
      .flatMap((file) => {
        const text = readFileSync(join(serverDir, file), 'utf8');
        return statusWrites(text).map((at) => `${file}: ${enclosingFunction(text, at)}`);
      });
    expect(outside).toEqual([]);
  });

  it('runs/lifecycle.ts writes them in its named transitions, each drawn in its header', () => {
    const text = readFileSync(join(serverDir, lifecycleFile), 'utf8');
    const header = text.slice(0, text.indexOf('*/'));
    const writers = statusWrites(text).map((at) => enclosingFunction(text, at));
    expect(new Set(writers)).toEqual(
      new Set([
        'promoteDueDeferred',
        'queueScheduled',
        'startRun',
        'startFirstDeferred',
        'expireRuns',
        'finishRun',
        'pauseRun',
        'resumeRun',
        'cancelNotStarted',
        'failLostRuns',
        'interruptRuns',
        'endOrphanedRuns',
      ]),
    );
    for (const name of [...writers, 'bornStatus', 'insertRuns', 'admitDecided', 'requestCancel']) {
      expect(header, `${name} is drawn in the header`).toContain(name);
    }
  });

  it('in the migrations, only the admission functions write a status, and the lifecycle header names them', () => {
    const writers = filesUnder(join(serverDir, 'sql'), '.sql').flatMap((path) => {
      const text = readFileSync(path, 'utf8');
      return statusWrites(text).map((at) => `${relative(serverDir, path)}: ${enclosingFunction(text, at)}`);
    });
    expect(writers).toEqual([
      'sql/016_admission_fast_path.sql: sluice_insert_runs',
      'sql/034_admission_alone.sql: sluice_admit',
    ]);
    const header = readFileSync(join(serverDir, lifecycleFile), 'utf8').split('*/')[0]!;
    expect(header).toContain('sluice_insert_runs');
    expect(header).toContain('sluice_admit,');
  });
});
