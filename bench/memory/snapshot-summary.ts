/**
 * The largest kinds of object in a V8 heap snapshot (`v8.writeHeapSnapshot`): self sizes
 * summed by node type and name, largest first. What the snapshot holds is what was live: it
 * is taken after a full garbage collection.
 */
import { readFileSync } from 'node:fs';

interface Snapshot {
  snapshot: { meta: { node_fields: string[]; node_types: [string[], ...unknown[]] } };
  nodes: number[];
  strings: string[];
}

export function largestKinds(file: string, top = 6): { kind: string; bytes: number; count: number }[] {
  const heap = JSON.parse(readFileSync(file, 'utf8')) as Snapshot;
  const fields = heap.snapshot.meta.node_fields;
  const [typeAt, nameAt, sizeAt] = ['type', 'name', 'self_size'].map((f) => fields.indexOf(f)) as [
    number,
    number,
    number,
  ];
  const types = heap.snapshot.meta.node_types[0];
  const kinds = new Map<string, { bytes: number; count: number }>();
  for (let i = 0; i < heap.nodes.length; i += fields.length) {
    const type = types[heap.nodes[i + typeAt]!]!;
    const name =
      type === 'string' || type === 'concatenated string'
        ? '(strings)'
        : heap.strings[heap.nodes[i + nameAt]!]!;
    const kind = `${type}: ${name.slice(0, 60)}`;
    const entry = kinds.get(kind) ?? { bytes: 0, count: 0 };
    entry.bytes += heap.nodes[i + sizeAt]!;
    entry.count++;
    kinds.set(kind, entry);
  }
  return [...kinds]
    .map(([kind, e]) => ({ kind, ...e }))
    .sort((a, b) => b.bytes - a.bytes)
    .slice(0, top);
}
