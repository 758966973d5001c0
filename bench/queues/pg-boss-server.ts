/**
 * pg-boss 10 in bench:queues, as its docs set it up: one `PgBoss` for the route's `send` and
 * the workers, `work` called once per worker (pg-boss 10's way to run jobs at once), polling at
 * its shortest interval (0.5 s), a pool of 20 connections as Sluice's. Under a cap, the queue has the `singleton` policy and each job
 * one of the tenant's singleton keys (one active job per key).
 */
import PgBoss from 'pg-boss';
import { answerParent, childOptions, failStart } from './child.js';
import { modelCaller } from './model-call.js';
import type { SystemOptions } from './options.js';
import { laneDealer, startPeerRoute, type RunJob } from './peer-route.js';

const options = childOptions<SystemOptions>();
try {
  const boss = new PgBoss({ connectionString: options.databaseUrl, max: 20 });
  let errors = 0;
  boss.on('error', () => errors++);
  await boss.start();
  await boss.createQueue('model', {
    name: 'model',
    policy: options.tenantCap > 0 ? 'singleton' : 'standard',
  });
  const call = modelCaller(options.providerUrl);
  for (let i = 0; i < options.workers; i++) {
    await boss.work<RunJob>('model', { pollingIntervalSeconds: 0.5, batchSize: 1 }, async ([job]) => {
      await call(job!.data.input);
    });
  }
  const lane = options.tenantCap > 0 ? laneDealer(options.tenantCap) : undefined;
  const { app, ready } = await startPeerRoute(options.tenants, (job) =>
    boss.send('model', job, lane ? { singletonKey: lane(job.tenant) } : {}),
  );
  answerParent(
    { ...ready },
    {
      errors: () => ({ errors }),
      stop: async () => {
        await app.close();
        await boss.stop({ graceful: true, wait: true });
      },
    },
  );
} catch (error) {
  failStart(error);
}
