import { inject } from 'vitest';
import { Redis } from 'ioredis';
import { afterThisTest } from '../helpers.js';

/** This run's Redis (scripts/vitest-global-setup.ts); undefined when redis-server is not installed. */
export const redis = inject('redis');

/**
 * The URL of Redis database `db` of this run's Redis, emptied first: each test file takes its
 * own number, so files running at once do not see each other's keys.
 */
export async function redisDatabase(db: number): Promise<string> {
  if (!redis) throw new Error('redis-server is required under CI=true (apt-get install redis-server)');
  const url = `${redis}/${db}`;
  const client = new Redis(url, { lazyConnect: true });
  await client.connect();
  await client.flushdb();
  afterThisTest(async () => void (await client.quit()));
  return url;
}

/** A plain client on `url`, closed after the test. */
export async function rawClient(url: string): Promise<Redis> {
  const client = new Redis(url, { lazyConnect: true });
  await client.connect();
  afterThisTest(async () => void (await client.quit()));
  return client;
}
