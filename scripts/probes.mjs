// Probes shared by the test setup (vitest-global-setup.ts, postgres.mjs) and the benches that
// start their own services (bench/soak/services.ts): a free loopback port, and whether a
// PostgreSQL (or PgBouncer) answers a query. Plain ESM, so postgres.mjs runs without tsx.
import { createServer } from 'node:net';
import pg from 'pg';

/** A free port on 127.0.0.1 (free when asked: take it at once). */
export function freePort() {
  return new Promise((resolvePort, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      probe.close(() => resolvePort(typeof address === 'object' && address ? address.port : 0));
    });
  });
}

/** Whether a PostgreSQL (or a pooler in front of one) at `config` answers `SELECT 1`. */
export async function postgresAnswers(config, timeoutMs = 3000) {
  const client = new pg.Client({
    ...(typeof config === 'string' ? { connectionString: config } : config),
    connectionTimeoutMillis: timeoutMs,
  });
  client.on('error', () => undefined);
  try {
    await client.connect();
    await client.query('SELECT 1');
    return true;
  } catch {
    return false;
  } finally {
    await client.end().catch(() => undefined);
  }
}
